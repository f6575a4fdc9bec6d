package fakekinds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/backoff"
)

// Under the data directory: the files the fakehw section converges, and
// one line per file it wrote ("write NAME <first 8 hex of the content's
// SHA-256>") or removed ("remove NAME"), so a test can count side effects.
const (
	SectionDir = "fakehw/section"
	SectionLog = "fakehw/section.log"
)

// SectionBody is the fakehw section of a fakehw build's NodeSpec:
//
//	{"fakehw": {"files": {"name": "content"}, "apply_delay_ms": 200,
//	            "fail": {"mode": "retryable", "times": 2}}}
//
// files are kept in data_dir/fakehw/section (names [a-z0-9._-], at most
// 64; content at most 64 KiB); apply_delay_ms is slept before each write,
// so a kill can land inside an apply; fail makes Apply fail: "retryable"
// for the first times applies of a generation in this process,
// "terminal" always.
type SectionBody struct {
	Files        map[string]string `json:"files,omitempty"`
	ApplyDelayMS int               `json:"apply_delay_ms,omitempty"`
	Fail         *struct {
		Mode  string `json:"mode"`
		Times int    `json:"times,omitempty"`
	} `json:"fail,omitempty"`
}

var fileName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// Section is the fakehw section over dataDir.
func Section(dataDir string) converge.Section {
	return &section{dataDir: dataDir, failures: map[uint64]int{}}
}

type section struct {
	dataDir string

	mu       sync.Mutex
	gen      uint64
	failures map[uint64]int // applies failed, by generation
}

func (s *section) Name() string { return "fakehw" }

func (s *section) Arrived(gen uint64, _ converge.Arrival) {
	s.mu.Lock()
	s.gen = gen
	s.mu.Unlock()
}

func decodeSection(body json.RawMessage) (SectionBody, error) {
	var b SectionBody
	if err := converge.DecodeSection(body, &b); err != nil {
		return b, err
	}
	if len(b.Files) > 64 {
		return b, fmt.Errorf("%d files; at most 64", len(b.Files))
	}
	for name, content := range b.Files {
		if !fileName.MatchString(name) {
			return b, fmt.Errorf("file name %q is not [a-z0-9._-]{1,64}", name)
		}
		if len(content) > 64<<10 {
			return b, fmt.Errorf("file %s is over 64 KiB", name)
		}
	}
	if b.ApplyDelayMS < 0 || b.ApplyDelayMS > 60000 {
		return b, errors.New("apply_delay_ms must be within 0..60000")
	}
	if b.Fail != nil && b.Fail.Mode != "retryable" && b.Fail.Mode != "terminal" {
		return b, fmt.Errorf("fail.mode %q is not retryable or terminal", b.Fail.Mode)
	}
	return b, nil
}

func (s *section) Check(body json.RawMessage) error { _, err := decodeSection(body); return err }

func (s *section) dir() string { return filepath.Join(s.dataDir, SectionDir) }

func (s *section) Plan(_ context.Context, body json.RawMessage) (converge.Plan, error) {
	b, err := decodeSection(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	var p converge.Plan
	var ops []fileOp
	names := make([]string, 0, len(b.Files))
	for n := range b.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		got, err := os.ReadFile(filepath.Join(s.dir(), n))
		if err != nil || string(got) != b.Files[n] {
			p.Changes = append(p.Changes, "write "+n)
			ops = append(ops, fileOp{"write", n})
		}
	}
	ents, _ := os.ReadDir(s.dir())
	for _, e := range ents {
		if _, ok := b.Files[e.Name()]; !ok {
			p.Changes = append(p.Changes, "remove "+e.Name())
			ops = append(ops, fileOp{"remove", e.Name()})
		}
	}
	p.Detail = ops
	return p, nil
}

// fileOp is one write or removal a plan found.
type fileOp struct{ op, name string }

func (s *section) Apply(ctx context.Context, body json.RawMessage, p converge.Plan) error {
	b, err := decodeSection(body)
	if err != nil {
		return converge.Terminal(err)
	}
	if b.Fail != nil {
		s.mu.Lock()
		gen := s.gen
		s.failures[gen]++
		n := s.failures[gen]
		s.mu.Unlock()
		switch {
		case b.Fail.Mode == "terminal":
			return converge.Terminal(fmt.Errorf("fakehw: injected terminal failure (generation %d)", gen))
		case n <= b.Fail.Times:
			return fmt.Errorf("fakehw: injected failure %d of %d (generation %d)", n, b.Fail.Times, gen)
		}
	}
	if err := os.MkdirAll(s.dir(), 0o700); err != nil {
		return err
	}
	ops, _ := p.Detail.([]fileOp)
	for _, o := range ops {
		op, name := o.op, o.name
		if err := backoff.Sleep(ctx, time.Duration(b.ApplyDelayMS)*time.Millisecond); err != nil {
			return err
		}
		switch op {
		case "write":
			err = atomicfile.Write(filepath.Join(s.dir(), name), []byte(b.Files[name]), 0o600)
		case "remove":
			err = os.Remove(filepath.Join(s.dir(), name))
		}
		if err != nil {
			return err
		}
		line := op + " " + name
		if op == "write" {
			sum := sha256.Sum256([]byte(b.Files[name]))
			line += " " + hex.EncodeToString(sum[:4])
		}
		if err := s.logLine(line); err != nil {
			return err
		}
	}
	return nil
}

// logLine appends one line (fsynced) to the section log.
func (s *section) logLine(line string) error {
	f, err := os.OpenFile(filepath.Join(s.dataDir, SectionLog), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, line)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
