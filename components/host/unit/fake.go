package unit

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Fake is a System in memory for what cannot run here (GPUs, NVIDIA's
// tools, a boot loader, a kernel's modules): files by path, tools as
// functions, every command it ran recorded.
type Fake struct {
	mu    sync.Mutex
	files map[string]string
	tools map[string]Tool
	calls []string
}

// Tool is a stand-in command: it sees the fake (to change files as the
// real tool would) and its arguments.
type Tool func(f *Fake, args []string) (string, error)

// NewFake returns an empty fake host.
func NewFake() *Fake { return &Fake{files: map[string]string{}, tools: map[string]Tool{}} }

// SetFile sets a file's content (tests; /proc and /sys included).
func (f *Fake) SetFile(name, content string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[name] = content
}

// File reads a file (tests); ok is false when absent.
func (f *Fake) File(name string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.files[name]
	return c, ok
}

// SetTool installs a stand-in command.
func (f *Fake) SetTool(name string, t Tool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tools[name] = t
}

// Calls answers the commands run so far, "tool arg arg", and forgets them.
func (f *Fake) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *Fake) ReadFile(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return []byte(c), nil
}

func (f *Fake) WriteFile(name string, data []byte) error {
	f.SetFile(name, string(data))
	return nil
}

func (f *Fake) RemoveFile(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.files, name)
	return nil
}

func (f *Fake) WriteKernel(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files[name]; !ok {
		return fmt.Errorf("write %s: %w", name, fs.ErrNotExist)
	}
	f.files[name] = value
	return nil
}

func (f *Fake) Exists(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.files[name]; ok {
		return true
	}
	for p := range f.files {
		if strings.HasPrefix(p, name+"/") {
			return true
		}
	}
	return false
}

func (f *Fake) Glob(pattern string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	n := strings.Count(pattern, "/")
	for p := range f.files {
		parts := strings.Split(p, "/")
		if len(parts) <= n {
			continue
		}
		cand := strings.Join(parts[:n+1], "/")
		if ok, _ := filepath.Match(pattern, cand); ok {
			seen[cand] = true
		}
	}
	out := make([]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func (f *Fake) Has(tool string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.tools[tool]
	return ok
}

func (f *Fake) Run(_ context.Context, tool string, args ...string) ([]byte, error) {
	f.mu.Lock()
	t, ok := f.tools[tool]
	f.calls = append(f.calls, strings.TrimSpace(tool+" "+strings.Join(args, " ")))
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%s is not installed on this host", tool)
	}
	out, err := t(f, args)
	if err != nil {
		return []byte(out), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, out)
	}
	return []byte(out), nil
}
