// Package xid finds NVIDIA Xid errors in the kernel log and keeps this
// boot's in data_dir/faults.json.
//
// Parse reads one line, either a /dev/kmsg record or a dmesg line, and never
// panics on malformed input. ReadKmsg reads every record the kernel still
// holds in /dev/kmsg and returns the Xid events among them; readKmsg is its
// twin over an io.Reader, so tests replay captured logs. Store keeps the
// events of the boot they happened in: a bcd restart in the same boot keeps
// them, a reboot drops them, and Clear forgets a GPU once a reset left it
// healthy.
package xid

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// Event is one Xid the NVIDIA driver logged.
type Event struct {
	// Code is the Xid number (79: the GPU has fallen off the bus).
	Code int
	// PCIBusID is the GPU's address as the driver wrote it, lower-cased
	// ("0000:17:00", without the function); empty when the line named the
	// GPU some other way.
	PCIBusID string
	// Message is the driver's text after the code, without the pid= and
	// name= fields of the process that was running.
	Message string
	// At is the kernel's monotonic timestamp of the record (microseconds in
	// /dev/kmsg, seconds in dmesg's brackets); zero when the line had none.
	At time.Duration
}

// marker starts the driver's Xid message in every driver generation.
var marker = []byte("NVRM: Xid (")

// maxLine bounds one kernel log line; longer lines are skipped.
const maxLine = 64 << 10

// Parse returns the Xid event in one kernel log line: a /dev/kmsg record
// ("6,1234,5678901,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=foo,
// GPU has fallen off the bus."), a dmesg line ("[   12.345678] NVRM: Xid
// ..."), or any line that carries the driver's message after a prefix
// (journalctl, syslog). ok is false for every other line.
func Parse(line []byte) (ev Event, ok bool) {
	i := bytes.Index(line, marker)
	if i < 0 {
		return Event{}, false
	}
	ev.At = timestamp(line[:i])
	rest := line[i+len(marker):]

	// The GPU: "PCI:0000:17:00", "0000:17:00" (older drivers) or
	// "PCI:0000:17:00.0".
	end := bytes.IndexByte(rest, ')')
	if end < 0 {
		return Event{}, false
	}
	ev.PCIBusID = busID(rest[:end])
	rest = rest[end+1:]

	// ": 79" then the end, a comma or a space.
	rest, found := bytes.CutPrefix(rest, []byte(":"))
	if !found {
		return Event{}, false
	}
	rest = bytes.TrimLeft(rest, " \t")
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n > 6 || (n < len(rest) && rest[n] != ',' && rest[n] != ' ' && rest[n] != '\t' && rest[n] != '\r' && rest[n] != '\n') {
		return Event{}, false
	}
	code, err := strconv.Atoi(string(rest[:n]))
	if err != nil {
		return Event{}, false
	}
	ev.Code = code
	ev.Message = message(rest[n:])
	return ev, true
}

// busID validates and lower-cases the GPU address in "Xid (...)"; it drops
// the function so the same GPU always has the same key.
func busID(b []byte) string {
	b = bytes.TrimPrefix(bytes.TrimSpace(b), []byte("PCI:"))
	s := strings.ToLower(string(b))
	s, fn, hasFn := strings.Cut(s, ".")
	if hasFn && (len(fn) != 1 || fn[0] < '0' || fn[0] > '7') {
		return ""
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 || len(parts[0]) < 4 || len(parts[0]) > 8 || len(parts[1]) != 2 || len(parts[2]) != 2 {
		return ""
	}
	for _, p := range parts {
		if !isHex(p) {
			return ""
		}
	}
	return normalize(s)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// message drops the leading ", pid=..., name=..." fields newer drivers
// write and returns the rest.
func message(b []byte) string {
	b = bytes.TrimRight(b, " \t\r\n")
	for {
		b = bytes.TrimLeft(b, ", \t")
		if !bytes.HasPrefix(b, []byte("pid=")) && !bytes.HasPrefix(b, []byte("name=")) {
			break
		}
		i := bytes.Index(b, []byte(", "))
		if i < 0 {
			b = nil
			break
		}
		b = b[i+2:]
	}
	return string(b)
}

// timestamp reads the monotonic time in the prefix before the driver's
// message: "prio,seq,usec,flags;" of a /dev/kmsg record, or "[secs.frac]"
// (after an optional "<prio>") of a dmesg line.
func timestamp(prefix []byte) time.Duration {
	if head, _, ok := bytes.Cut(prefix, []byte(";")); ok {
		fields := bytes.Split(head, []byte(","))
		if len(fields) >= 4 && digits(fields[0]) && digits(fields[1]) && digits(fields[2]) {
			us, err := strconv.ParseInt(string(fields[2]), 10, 64)
			if err != nil || us > math.MaxInt64/int64(time.Microsecond) {
				return 0
			}
			return time.Duration(us) * time.Microsecond
		}
		return 0
	}
	if len(prefix) > 0 && prefix[0] == '<' {
		if i := bytes.IndexByte(prefix, '>'); i > 0 && digits(prefix[1:i]) {
			prefix = prefix[i+1:]
		}
	}
	inner, found := bytes.CutPrefix(prefix, []byte("["))
	if !found {
		return 0
	}
	end := bytes.IndexByte(inner, ']')
	if end < 0 {
		return 0
	}
	secs, frac, _ := bytes.Cut(bytes.TrimSpace(inner[:end]), []byte("."))
	if !digits(secs) || (len(frac) > 0 && !digits(frac)) || len(frac) > 9 {
		return 0
	}
	s, err := strconv.ParseInt(string(secs), 10, 64)
	if err != nil || s > math.MaxInt64/int64(time.Second)-1 {
		return 0
	}
	d := time.Duration(s) * time.Second
	if len(frac) > 0 {
		f, _ := strconv.ParseInt(string(frac), 10, 64)
		for range 9 - len(frac) {
			f *= 10
		}
		d += time.Duration(f)
	}
	return d
}

func digits(b []byte) bool {
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

// readKmsg parses a /dev/kmsg stream (or dmesg output) from r and returns
// its Xid events in order. Continuation lines, which start with a space in
// the /dev/kmsg format and carry a record's key=value dictionary, are
// skipped, and so are lines longer than maxLine.
func readKmsg(r io.Reader) ([]Event, error) {
	br := bufio.NewReaderSize(r, 16<<10)
	var (
		events []Event
		long   []byte // a line being assembled across full buffers
		skip   bool   // the current line is too long
	)
	for {
		chunk, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if !skip {
				long = append(long, chunk...)
				if len(long) > maxLine {
					long, skip = nil, true
				}
			}
			continue
		}
		line := chunk
		if long != nil || skip {
			if skip || len(long)+len(chunk) > maxLine {
				line = nil
			} else {
				line = append(long, chunk...)
			}
			long, skip = nil, false
		}
		if len(line) > 0 && line[0] != ' ' {
			if ev, ok := Parse(line); ok {
				events = append(events, ev)
			}
		}
		if err == io.EOF {
			return events, nil
		}
		if err != nil {
			return events, fmt.Errorf("reading the kernel log: %w", err)
		}
	}
}
