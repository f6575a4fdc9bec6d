// Package pressure samples the host's pressure for the node's StatusReport:
// Linux PSI (pressure stall information) from /proc/pressure/{cpu,memory,io}
// and CPU steal from the aggregate "cpu" line of /proc/stat.
//
// PSI is optional: a kernel built without CONFIG_PSI, or booted with psi=0,
// has no /proc/pressure, and the sample then says Available false (not an
// error). Steal is read either way; it is the share of CPU time stolen
// between the last two samples, so the first sample of a Sampler says 0.
//
// ParsePSI and ParseStat are the parsers, separate so they can be tested
// and fuzzed on any bytes: they never panic and refuse malformed input with
// an error naming the line.
package pressure

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// maxFile bounds what is read of one procfs file; the real ones are a few
// hundred bytes (/proc/stat a few KiB per hundred CPUs).
const maxFile = 1 << 20

// Sampler reads pressure under a proc root and keeps the last /proc/stat
// reading to compute steal. It is safe for concurrent use.
type Sampler struct {
	root string

	mu       sync.Mutex
	prev     CPUTimes
	havePrev bool
}

// New returns a Sampler reading procRoot ("/proc" on a real machine; tests
// pass a directory holding pressure/ and stat).
func New(procRoot string) *Sampler {
	return &Sampler{root: procRoot}
}

// Sample is Read without its error: what could be read, at now.
func (s *Sampler) Sample(now time.Time) *bcdv1.Pressure {
	p, _ := s.Read(now)
	return p
}

// Read samples pressure at now. The result is never nil: what could not
// be read is left zero and named in the error. Available is true when all
// three PSI files were read; a missing <procRoot>/pressure (or a kernel
// answering EOPNOTSUPP: PSI disabled) makes it false without an error.
func (s *Sampler) Read(now time.Time) (*bcdv1.Pressure, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := &bcdv1.Pressure{AtUnixMs: now.UnixMilli()}
	var errs []error

	avail, err := s.readPSI(p)
	p.Available = avail
	if err != nil {
		errs = append(errs, err)
	}

	path := filepath.Join(s.root, "stat")
	if b, err := readFile(path); err != nil {
		errs = append(errs, err)
	} else if t, err := ParseStat(b); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	} else {
		if s.havePrev {
			p.CpuStealPercent = StealPercent(s.prev, t)
		}
		s.prev, s.havePrev = t, true
	}
	return p, errors.Join(errs...)
}

// readPSI fills p's PSI fields and reports whether all three files were
// read.
func (s *Sampler) readPSI(p *bcdv1.Pressure) (bool, error) {
	dir := filepath.Join(s.root, "pressure")
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil // no PSI in this kernel
		}
		return false, err // names the path
	}
	var errs []error
	avail := true
	for _, res := range []string{"cpu", "memory", "io"} {
		path := filepath.Join(dir, res)
		b, err := readFile(path)
		if errors.Is(err, syscall.EOPNOTSUPP) {
			avail = false // PSI compiled in but disabled
			continue
		}
		if err != nil {
			avail = false
			errs = append(errs, err)
			continue
		}
		psi, err := ParsePSI(b)
		if err == nil && res != "cpu" && !psi.HasFull {
			err = errors.New("no full line")
		}
		if err != nil {
			avail = false
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		switch res {
		case "cpu":
			p.CpuSomeAvg10, p.CpuSomeAvg60 = psi.Some.Avg10, psi.Some.Avg60
		case "memory":
			p.MemorySomeAvg10, p.MemoryFullAvg10 = psi.Some.Avg10, psi.Full.Avg10
		case "io":
			p.IoSomeAvg10, p.IoFullAvg10 = psi.Some.Avg10, psi.Full.Avg10
		}
	}
	return avail, errors.Join(errs...)
}

// readFile reads at most maxFile bytes of path; a longer file is an error.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxFile {
		return nil, fmt.Errorf("%s: longer than %d bytes", path, maxFile)
	}
	return b, nil
}
