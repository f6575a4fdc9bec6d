package pressure

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// Averages is one line of a PSI file: the share of wall time (percent)
// in which tasks stalled, averaged over 10, 60 and 300 seconds, and the
// total stall time in microseconds since boot.
type Averages struct {
	Avg10, Avg60, Avg300 float64
	Total                uint64
}

// PSI is one /proc/pressure file: "some" (at least one task stalled) and,
// where the kernel writes it, "full" (all non-idle tasks stalled). The
// memory and io files always have a full line; cpu has one from Linux 5.13
// (all zero at the system level).
type PSI struct {
	Some    Averages
	Full    Averages
	HasFull bool
}

// CPUTimes is the aggregate "cpu" line of /proc/stat, in clock ticks:
// Total is the sum of user, nice, system, idle, iowait, irq, softirq and
// steal (guest time is already counted in user and nice), Steal the time
// the hypervisor ran something else while this machine wanted the CPU,
// Idle the time it was idle or waiting for I/O.
type CPUTimes struct {
	Total, Steal, Idle uint64
}

// ParsePSI reads the content of a /proc/pressure file:
//
//	some avg10=0.12 avg60=0.05 avg300=0.01 total=12345
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//
// Each line must name its kind (some or full) once and carry avg10, avg60,
// avg300 (finite, 0 to 100) and total (an unsigned integer) exactly once;
// other key=value fields are ignored, so a kernel adding one still parses.
// A "some" line is required; blank lines are skipped. Anything else is an
// error naming the line.
func ParsePSI(b []byte) (PSI, error) {
	var (
		p        PSI
		haveSome bool
	)
	for n, line := range bytes.Split(b, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var (
			dst  *Averages
			kind = string(fields[0])
		)
		switch kind {
		case "some":
			if haveSome {
				return PSI{}, lineErr(n, line, "a second some line")
			}
			haveSome, dst = true, &p.Some
		case "full":
			if p.HasFull {
				return PSI{}, lineErr(n, line, "a second full line")
			}
			p.HasFull, dst = true, &p.Full
		default:
			return PSI{}, lineErr(n, line, "starts with neither some nor full")
		}
		a, err := parseAverages(fields[1:])
		if err != nil {
			return PSI{}, lineErr(n, line, err.Error())
		}
		*dst = a
	}
	if !haveSome {
		return PSI{}, errors.New("no some line")
	}
	return p, nil
}

// parseAverages reads the key=value fields of one PSI line.
func parseAverages(fields [][]byte) (Averages, error) {
	var (
		a    Averages
		seen = map[string]bool{}
	)
	for _, f := range fields {
		k, v, ok := bytes.Cut(f, []byte("="))
		if !ok || len(k) == 0 || len(v) == 0 {
			return Averages{}, fmt.Errorf("field %s is not key=value", quote(f))
		}
		key := string(k)
		var dst *float64
		switch key {
		case "avg10":
			dst = &a.Avg10
		case "avg60":
			dst = &a.Avg60
		case "avg300":
			dst = &a.Avg300
		case "total":
			t, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil || !isDigits(v) {
				return Averages{}, fmt.Errorf("total=%s is not an unsigned integer", quote(v))
			}
			a.Total = t
		default:
			continue // a field this parser does not know
		}
		if seen[key] {
			return Averages{}, fmt.Errorf("%s appears twice", key)
		}
		seen[key] = true
		if dst != nil {
			x, err := strconv.ParseFloat(string(v), 64)
			if err != nil || !isDecimal(v) || math.IsNaN(x) || x < 0 || x > 100 {
				return Averages{}, fmt.Errorf("%s=%s is not a percentage (a decimal from 0 to 100)", key, quote(v))
			}
			*dst = x
		}
	}
	for _, k := range []string{"avg10", "avg60", "avg300", "total"} {
		if !seen[k] {
			return Averages{}, fmt.Errorf("no %s", k)
		}
	}
	return a, nil
}

// ParseStat reads the aggregate "cpu" line of /proc/stat:
//
//	cpu  84698 0 27655 89578 2592 0 458 369 0 0
//
// (user, nice, system, idle, iowait, irq, softirq, steal, guest,
// guest_nice). It needs at least the first eight values, each an unsigned
// integer; fewer (kernels before 2.6.11), a value that is not a number, or
// a sum that overflows is an error, and so is input without a "cpu" line.
func ParseStat(b []byte) (CPUTimes, error) {
	for n, line := range bytes.Split(b, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) == 0 || string(fields[0]) != "cpu" {
			continue
		}
		vals := fields[1:]
		if len(vals) < 8 {
			return CPUTimes{}, lineErr(n, line, fmt.Sprintf("%d values, want at least 8 (the 8th is steal)", len(vals)))
		}
		var t CPUTimes
		for i, v := range vals {
			x, err := strconv.ParseUint(string(v), 10, 64)
			if err != nil || !isDigits(v) {
				return CPUTimes{}, lineErr(n, line, fmt.Sprintf("value %d (%s) is not an unsigned integer", i+1, quote(v)))
			}
			if i >= 8 {
				continue // guest and guest_nice are already in user and nice
			}
			sum, carry := bits.Add64(t.Total, x, 0)
			if carry != 0 {
				return CPUTimes{}, lineErr(n, line, "the values overflow 64 bits")
			}
			t.Total = sum
			switch i {
			case 3, 4:
				t.Idle += x
			case 7:
				t.Steal = x
			}
		}
		return t, nil
	}
	return CPUTimes{}, errors.New(`no "cpu" line`)
}

// StealPercent is the share of CPU time stolen between two readings of
// /proc/stat, 0 to 100. It is 0 when no time passed or the counters went
// backwards (a different boot, or a reading out of order).
func StealPercent(prev, cur CPUTimes) float64 {
	if cur.Total <= prev.Total || cur.Steal < prev.Steal {
		return 0
	}
	p := float64(cur.Steal-prev.Steal) / float64(cur.Total-prev.Total) * 100
	return math.Min(math.Max(p, 0), 100)
}

// BusyShare is the share of CPU time spent working (neither idle, waiting
// for I/O nor stolen) between two readings of /proc/stat, 0 to 1; 0 when
// no time passed or the counters went backwards.
func BusyShare(prev, cur CPUTimes) float64 {
	if cur.Total <= prev.Total || cur.Idle < prev.Idle || cur.Steal < prev.Steal {
		return 0
	}
	idle := float64(cur.Idle-prev.Idle) + float64(cur.Steal-prev.Steal)
	return math.Min(math.Max(1-idle/float64(cur.Total-prev.Total), 0), 1)
}

// Meminfo is what /proc/meminfo says of the memory, in bytes.
type Meminfo struct {
	Total, Available uint64
}

// ParseMeminfo reads MemTotal and MemAvailable ("MemTotal: 263856988 kB")
// from /proc/meminfo. Either missing, a value that is not an unsigned
// integer of kB, or one that overflows is an error.
func ParseMeminfo(b []byte) (Meminfo, error) {
	var m Meminfo
	var seen int
	for n, line := range bytes.Split(b, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var dst *uint64
		switch string(fields[0]) {
		case "MemTotal:":
			dst = &m.Total
		case "MemAvailable:":
			dst = &m.Available
		default:
			continue
		}
		if len(fields) != 3 || string(fields[2]) != "kB" || !isDigits(fields[1]) {
			return Meminfo{}, lineErr(n, line, "want <name>: <number> kB")
		}
		kb, err := strconv.ParseUint(string(fields[1]), 10, 64)
		if err != nil || kb > math.MaxUint64/1024 {
			return Meminfo{}, lineErr(n, line, "the value overflows")
		}
		*dst = kb * 1024
		seen++
	}
	if seen < 2 || m.Total == 0 {
		return Meminfo{}, errors.New("no MemTotal and MemAvailable")
	}
	return m, nil
}

func isDigits(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// isDecimal accepts what the kernel writes for an average ("12.34"):
// digits with at most one dot, none of strconv's other spellings (hex,
// exponents, underscores, Inf, NaN).
func isDecimal(b []byte) bool {
	intPart, frac, hasDot := bytes.Cut(b, []byte("."))
	if !isDigits(intPart) {
		return false
	}
	return !hasDot || isDigits(frac)
}

// lineErr names a refused line (1-based) and quotes its start.
func lineErr(n int, line []byte, why string) error {
	return fmt.Errorf("line %d %s: %s", n+1, quote(bytes.TrimSpace(line)), why)
}

// quote quotes at most 64 bytes of b for an error message.
func quote(b []byte) string {
	const max = 64
	if len(b) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(b[cut]) {
			cut--
		}
		return strconv.Quote(string(b[:cut])) + "..."
	}
	return strconv.Quote(string(b))
}
