package kmod

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// MaxModuleSize bounds a decompressed module (the largest Debian modules
// are a few tens of MiB).
const MaxModuleSize = 256 << 20

// The finit_module flag asking the kernel to decompress the file itself
// (Linux 6.4+, CONFIG_MODULE_DECOMPRESS); used for .ko.xz, which this
// package does not decompress.
const moduleInitCompressedFile = 4

// State is what loading did to one module.
type State string

// States of a Result.
const (
	Loaded        State = "loaded"
	AlreadyLoaded State = "already loaded"
	Failed        State = "failed"
	Skipped       State = "skipped" // a dependency failed
)

// Result is one module's outcome.
type Result struct {
	Module
	State State
	Err   error
	Took  time.Duration
}

// Loader loads modules from Root/Release.
type Loader struct {
	Root    string // e.g. /lib/modules
	Release string // e.g. 6.1.0-56-amd64 (uname -r)
	// Params are module parameters by canonical name ("nvme":
	// "poll_queues=1").
	Params map[string]string

	// The syscalls, replaced by tests: finit_module(2) and init_module(2).
	FinitModule func(fd int, params string, flags int) error
	InitModule  func(image []byte, params string) error
}

// NewLoader returns a Loader using the real syscalls.
func NewLoader(root, release string) *Loader {
	return &Loader{Root: root, Release: release, FinitModule: finitModule, InitModule: initModule}
}

// Load loads names and everything they need. See Loader.Load.
func Load(root, release string, names ...string) error {
	_, err := NewLoader(root, release).Load(names...)
	return err
}

// Dir is the release directory.
func (l *Loader) Dir() string { return filepath.Join(l.Root, l.Release) }

// Load resolves names against the tree's index and loads the plan in
// order. A failed module skips every module that depends on it and the
// rest go on; the error joins the failures of modules that were not soft.
// Results list every module of the plan (builtins are not listed: they
// have nothing to load).
func (l *Loader) Load(names ...string) ([]Result, error) {
	ix, err := ReadIndex(l.Dir())
	if err != nil {
		return nil, err
	}
	plan, err := ix.Resolve(names...)
	if err != nil {
		return nil, err
	}
	rs := l.LoadPlan(plan)
	return rs, planErr(rs)
}

// LoadPlan loads a resolved plan in order and returns each module's
// result.
func (l *Loader) LoadPlan(plan Plan) []Result {
	bad := map[string]string{} // module -> the failure that rules it out
	out := make([]Result, 0, len(plan.Modules))
	for _, m := range plan.Modules {
		res := Result{Module: m}
		for _, d := range m.Deps {
			if why, ok := bad[d]; ok {
				res.State, res.Err = Skipped, fmt.Errorf("kmod: %s: dependency %s %s", m.Name, d, why)
				break
			}
		}
		if res.State == "" {
			start := time.Now()
			res.Err = l.loadOne(m)
			res.Took = time.Since(start)
			switch {
			case res.Err == nil:
				res.State = Loaded
			case errors.Is(res.Err, syscall.EEXIST):
				res.State, res.Err = AlreadyLoaded, nil
			default:
				res.State = Failed
			}
		}
		if res.Err != nil {
			bad[m.Name] = string(res.State)
		}
		out = append(out, res)
	}
	return out
}

func planErr(rs []Result) error {
	var errs []error
	for _, r := range rs {
		if r.Err != nil && !r.Soft {
			errs = append(errs, r.Err)
		}
	}
	return errors.Join(errs...)
}

func (l *Loader) loadOne(m Module) error {
	p := filepath.Join(l.Dir(), m.Path)
	params := l.Params[m.Name]
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("kmod: %s: %w", m.Name, err)
	}
	defer f.Close()
	switch {
	case strings.HasSuffix(p, ".ko"):
		if err := l.FinitModule(int(f.Fd()), params, 0); err != nil {
			return fmt.Errorf("finit_module(%s, %q, 0) = %w", p, params, err)
		}
		return nil
	case strings.HasSuffix(p, ".ko.xz"):
		if err := l.FinitModule(int(f.Fd()), params, moduleInitCompressedFile); err != nil {
			return fmt.Errorf("finit_module(%s, %q, MODULE_INIT_COMPRESSED_FILE) = %w (an xz module needs a kernel that decompresses modules itself)", p, params, err)
		}
		return nil
	case strings.HasSuffix(p, ".ko.zst"), strings.HasSuffix(p, ".ko.gz"):
		image, err := decompress(f, p)
		if err != nil {
			return fmt.Errorf("kmod: %s: %w", m.Name, err)
		}
		if err := l.InitModule(image, params); err != nil {
			return fmt.Errorf("init_module(%s decompressed, %d bytes, %q) = %w", p, len(image), params, err)
		}
		return nil
	}
	return fmt.Errorf("kmod: %s: unknown module file type %s", m.Name, p)
}

func decompress(r io.Reader, name string) ([]byte, error) {
	var dr io.Reader
	if strings.HasSuffix(name, ".zst") {
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(MaxModuleSize))
		if err != nil {
			return nil, fmt.Errorf("zstd %s: %w", name, err)
		}
		defer d.Close()
		dr = d
	} else {
		g, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip %s: %w", name, err)
		}
		defer g.Close()
		dr = g
	}
	var b bytes.Buffer
	n, err := io.Copy(&b, io.LimitReader(dr, MaxModuleSize+1))
	if err != nil {
		return nil, fmt.Errorf("decompressing %s: %w", name, err)
	}
	if n > MaxModuleSize {
		return nil, fmt.Errorf("decompressing %s: larger than %d bytes", name, MaxModuleSize)
	}
	return b.Bytes(), nil
}
