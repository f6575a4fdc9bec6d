package e2e

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// TestConsoleOnARealPTY drives bcgw console from a pseudo-terminal of its
// own: the node starts the account's login shell on a pseudo-terminal, a
// typed command's output comes back, the shell runs as that account (not
// root), a resize of the local terminal reaches the remote one, and exit
// ends bcgw console.
func TestConsoleOnARealPTY(t *testing.T) {
	s := newSSHLab(t)
	s.bcgw(s.g, "ssh-ca", s.id, "--jwks-only")
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	out := &syncBuf{name: "the console's terminal"}
	go io.Copy(out, ptmx)
	var cmd *exec.Cmd
	eventually(t, "bcgw console opens", func() error {
		cmd = exec.Command(filepath.Join(s.bin, "bcgw"), "console", s.id, "--account", s.acct, "--data-dir", s.g.dataDir)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
		if err := cmd.Start(); err != nil {
			return err
		}
		time.Sleep(time.Second)
		if cmd.ProcessState == nil && !strings.Contains(out.String(), "bcgw console:") {
			return nil
		}
		cmd.Wait()
		return fmt.Errorf("bcgw console exited: %s", out.String())
	})
	tty.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	type_ := func(line string) {
		if _, err := ptmx.Write([]byte(line + "\r")); err != nil {
			t.Fatal(err)
		}
	}
	type_("echo ACCOUNT=$(id -un) UID=$(id -u); stty size; echo DONE$((6*7))")
	eventually(t, "the command's output", func() error {
		o := out.String()
		if !strings.Contains(o, "DONE42") || !strings.Contains(o, "ACCOUNT="+s.acct+" ") || !strings.Contains(o, "40 100") {
			return fmt.Errorf("terminal so far: %q", o)
		}
		if strings.Contains(o, "UID=0") {
			return fmt.Errorf("the shell runs as root: %q", o)
		}
		return nil
	})
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the resize reaches the node", func() error {
		type_("stty size")
		time.Sleep(300 * time.Millisecond)
		if !strings.Contains(out.String(), "50 132") {
			return fmt.Errorf("terminal so far: %q", out.String())
		}
		return nil
	})
	type_("exit")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("bcgw console after exit: %v: %q", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("bcgw console did not end after exit: %q", out.String())
	}
	eventually(t, "the console's events", func() error {
		ev := s.bcgw(s.g, "events", s.id, "--json")
		if !strings.Contains(ev, `"kind":"console"`) || !strings.Contains(ev, `"account":"`+s.acct+`"`) || !strings.Contains(ev, "tunnel.closed") {
			return fmt.Errorf("events %.1500s", ev)
		}
		return nil
	})
}
