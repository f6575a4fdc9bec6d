package roles

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/testenv"
)

// The test binary plays three parts, chosen by BCD_ROLES_TEST: a role
// started through Main (victim), the same process without Main
// (control), and a process of the same uid that copies their socket
// (attacker).
func TestMain(m *testing.M) {
	switch os.Getenv("BCD_ROLES_TEST") {
	case "victim":
		Main("node", []cli.Command{{Name: "hold", Run: func(context.Context, *cli.Env, []string) int { return holdSocket() }}}, nil)
	case "control":
		os.Exit(holdSocket())
	case "attacker":
		os.Exit(attack())
	}
	os.Exit(m.Run())
}

// holdSocket holds one end of a connected socket pair, prints its pid
// and that end's descriptor, and waits for stdin to close.
func holdSocket() int {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%d %d\n", os.Getpid(), fds[0])
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// attack starts the victim and the control as its own children (so no
// ptrace scope stands in the way of an ancestor) and prints, for each,
// whether pidfd_getfd copied the socket it holds.
func attack() int {
	for _, part := range []string{"control", "victim"} {
		cmd := exec.Command(os.Args[0], "hold")
		cmd.Env = append(os.Environ(), "BCD_ROLES_TEST="+part)
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		var pid, fd int
		if _, err := fmt.Fscan(bufio.NewReader(out), &pid, &fd); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", part, err)
			return 1
		}
		result := "copied"
		pidfd, err := unix.PidfdOpen(pid, 0)
		if err == nil {
			var copied int
			if copied, err = unix.PidfdGetfd(pidfd, fd, 0); err == nil {
				unix.Close(copied)
			}
			unix.Close(pidfd)
		}
		if err != nil {
			result = "refused:" + strings.ReplaceAll(err.Error(), " ", "_")
			if errors.Is(err, unix.ENOSYS) {
				result = "nosys"
			}
		}
		fmt.Printf("%s %s\n", part, result)
		in.Close()
		cmd.Wait()
	}
	return 0
}

// TestRoleNotDumpable: a process of the node's uid copies a connected
// socket out of a process of that uid with pidfd_getfd (how it would get
// a connection to bcd helper that passed the helper's /proc/PID/exe
// check, docs/helper.md "Who it serves"): it copies it from a process
// that did not go through Main, and is refused (EPERM) by a role started
// through Main, which made itself not dumpable.
func TestRoleNotDumpable(t *testing.T) {
	testenv.NeedRoot(t, "the attacker runs as a throwaway uid of its own")
	// The test binary, where that uid can run it.
	dir, err := os.MkdirTemp("", "bcd-dumpable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "roles.test")
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const uid = 64123 // no account needed: only the number
	cmd := exec.Command(bin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "BCD_ROLES_TEST=attacker")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("attacker: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if part, result, ok := strings.Cut(l, " "); ok {
			got[part] = result
		}
	}
	switch got["control"] {
	case "copied":
	case "nosys":
		testenv.Skip(t, "this kernel has no pidfd_getfd (Linux 5.6)")
	default:
		testenv.Skip(t, "this host refuses pidfd_getfd to an ancestor of the same uid (%s), so the copy cannot be shown either way", got["control"])
	}
	if got["victim"] != "refused:operation_not_permitted" {
		t.Errorf("pidfd_getfd on a role started through Main: %q, want refused with EPERM (attacker said %q)", got["victim"], out)
	}
}
