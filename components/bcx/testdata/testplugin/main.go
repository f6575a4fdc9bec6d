// Command testplugin is the bcx host tests' plugin: it echoes, sleeps,
// fails, exits and reports its own sandbox.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/bcx"
	"golang.org/x/sys/unix"
)

// flavor differs between builds of this plugin (-ldflags -X) so tests have
// two binaries with different hashes.
var flavor = "a"

type plugin struct{}

func (plugin) Describe() bcx.Description {
	return bcx.Description{DriverID: strings.TrimPrefix(filepath.Base(os.Args[0]), "bcx-"), Kind: "test", Version: flavor,
		Operations: []string{"test.echo", "test.sleep", "test.probe", "test.fail"}}
}

func (plugin) Invoke(ctx context.Context, op string, r bcx.Request) (json.RawMessage, error) {
	switch op {
	case "test.echo":
		return json.Marshal(map[string]any{"config": r.Config, "body": r.Body, "secret_len": len(r.Secrets["password"]), "pid": os.Getpid(), "flavor": flavor})
	case "test.sleep":
		mark("sleeping")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Minute):
			return json.RawMessage(`{}`), nil
		}
	case "test.probe":
		return probe()
	case "test.fail":
		return nil, &bcx.Error{Code: "boom", Message: "it failed\x01 on purpose", Retryable: true}
	}
	return nil, errors.New("unknown operation")
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func status(field string) string {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func probe() (json.RawMessage, error) {
	pgid, _ := syscall.Getpgid(0)
	exe, _ := os.Readlink("/proc/self/exe")
	mnt := unix.Mount("none", "/mnt", "tmpfs", 0, "")
	unshare := unix.Unshare(unix.CLONE_NEWNS)
	_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_ATTACH, uintptr(os.Getppid()), 0)
	var ptrace error
	if e != 0 {
		ptrace = e
	}
	var bpfErr error
	if _, _, e := unix.Syscall(unix.SYS_BPF, 0, 0, 0); e != 0 {
		bpfErr = e
	}
	_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	return json.Marshal(map[string]any{
		"pid": os.Getpid(), "pgid": pgid, "uid": os.Getuid(), "gid": os.Getgid(), "groups": status("Groups"),
		"no_new_privs": status("NoNewPrivs"), "seccomp": status("Seccomp"), "exe": exe,
		"mount": errText(mnt), "unshare": errText(unshare), "ptrace": errText(ptrace), "bpf": errText(bpfErr),
		"clone3": e.Error(), "home": os.Getenv("HOME"), "path": os.Getenv("PATH"),
	})
}

// mark leaves a file in $BCX_TEST_MARKS so a test sees what the plugin did.
func mark(what string) {
	if d := os.Getenv("BCX_TEST_MARKS"); d != "" {
		_ = os.WriteFile(filepath.Join(d, what+"-"+flavor+"-"+strconv.Itoa(os.Getpid())), nil, 0o644)
	}
}

func main() {
	if os.Getenv("BCX_TEST_EXIT_AT_START") != "" {
		mark("started")
		os.Exit(3)
	}
	mark("started")
	if err := bcx.Serve(plugin{}); err != nil {
		fmt.Fprintln(os.Stderr, "testplugin:", err)
		os.Exit(1)
	}
}
