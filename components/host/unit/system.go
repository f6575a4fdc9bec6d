package unit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
)

// System is what a unit reads and changes of the host: files by their
// absolute path on the host (the configuration bcd owns, /proc and /sys),
// and commands found in the system directories. Real is the host; Fake
// stands in where the host cannot be changed (no GPU, no boot loader).
type System interface {
	// ReadFile reads a file; a missing one is an error matching
	// fs.ErrNotExist.
	ReadFile(name string) ([]byte, error)
	// WriteFile writes a configuration file atomically (mode 0644),
	// creating its directories.
	WriteFile(name string, data []byte) error
	// RemoveFile removes a file; a missing one is success.
	RemoveFile(name string) error
	// WriteKernel writes a value into a kernel file (/proc/sys, /sys) in
	// place.
	WriteKernel(name, value string) error
	// Exists reports whether a path exists.
	Exists(name string) bool
	// Glob lists the paths matching pattern (filepath.Match syntax).
	Glob(pattern string) []string
	// Has reports whether a command is installed.
	Has(tool string) bool
	// Run runs a command with a fixed environment and answers its
	// combined output; a non-zero exit is an error carrying the output.
	Run(ctx context.Context, tool string, args ...string) ([]byte, error)
}

// SystemDirs are where Real looks for commands, never $PATH.
var SystemDirs = []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"}

// Real is the host: files under Root ("/" on a host; a directory in tests),
// the kernel's files under Kernel ("/" unless set), commands from
// SystemDirs (under ToolRoot when set: a test's stand-in tools).
type Real struct {
	Root     string
	Kernel   string
	ToolRoot string
}

func (r Real) file(name string) string {
	if strings.HasPrefix(name, "/proc/") || strings.HasPrefix(name, "/sys/") {
		k := r.Kernel
		if k == "" {
			k = "/"
		}
		return filepath.Join(k, name)
	}
	root := r.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, name)
}

func (r Real) ReadFile(name string) ([]byte, error) { return os.ReadFile(r.file(name)) }

func (r Real) WriteFile(name string, data []byte) error {
	p := r.file(name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(p, data, 0o644)
}

func (r Real) RemoveFile(name string) error {
	err := os.Remove(r.file(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (r Real) WriteKernel(name, value string) error {
	f, err := os.OpenFile(r.file(name), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

func (r Real) Exists(name string) bool { _, err := os.Stat(r.file(name)); return err == nil }

func (r Real) Glob(pattern string) []string {
	full := r.file(pattern)
	m, _ := filepath.Glob(full)
	prefix := strings.TrimSuffix(full, pattern)
	out := make([]string, 0, len(m))
	for _, p := range m {
		out = append(out, "/"+strings.TrimPrefix(strings.TrimPrefix(p, prefix), "/"))
	}
	return out
}

func (r Real) tool(name string) (string, bool) {
	for _, d := range SystemDirs {
		p := filepath.Join(r.ToolRoot, d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

func (r Real) Has(tool string) bool { _, ok := r.tool(tool); return ok }

// RunTimeout bounds one command.
const RunTimeout = 10 * time.Minute

func (r Real) Run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	p, ok := r.tool(tool)
	if !ok {
		return nil, fmt.Errorf("%s is not installed on this host (looked in %s)", tool, strings.Join(SystemDirs, ", "))
	}
	ctx, cancel := context.WithTimeout(ctx, RunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, p, args...)
	// apt-get and dpkg never ask: a unit runs unattended.
	cmd.Env = []string{"PATH=" + strings.Join(SystemDirs, ":"), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
	if r.ToolRoot != "" {
		cmd.Env = append(cmd.Env, "BCD_HOST_ROOT="+r.Root)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, clip(strings.TrimSpace(out.String())))
	}
	return out.Bytes(), nil
}

func clip(s string) string {
	if len(s) > 512 {
		return s[:512] + "..."
	}
	return s
}
