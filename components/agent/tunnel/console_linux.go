//go:build linux

package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
)

// Account is a local account as /etc/passwd has it.
type Account struct {
	Name        string
	UID, GID    uint32
	Home, Shell string
}

// LookupAccount reads an account from passwd (/etc/passwd on a host):
// os/user gives no login shell.
func LookupAccount(passwd, name string) (Account, error) {
	f, err := os.Open(passwd)
	if err != nil {
		return Account{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) != 7 || fs[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(fs[2], 10, 32)
		gid, err2 := strconv.ParseUint(fs[3], 10, 32)
		if err1 != nil || err2 != nil {
			return Account{}, fmt.Errorf("account %s: bad uid or gid in %s", name, passwd)
		}
		return Account{Name: name, UID: uint32(uid), GID: uint32(gid), Home: fs[5], Shell: fs[6]}, nil
	}
	if err := sc.Err(); err != nil {
		return Account{}, err
	}
	return Account{}, fmt.Errorf("no local account %s", name)
}

// ConsoleConfig is how consoles open.
type ConsoleConfig struct {
	// Passwd is /etc/passwd.
	Passwd string
	// RootConsole is [access] root_console: a ticket naming root may open
	// a root shell. Without it no console runs as root.
	RootConsole bool
}

// Console returns the Config.Console that starts the account's login
// shell on a new pseudo-terminal, as that account (bcd node must then run
// as root, or as that very account), in its home, with a clean
// environment.
func Console(cc ConsoleConfig) func(ctx context.Context, account string) (Target, error) {
	if cc.Passwd == "" {
		cc.Passwd = "/etc/passwd"
	}
	return func(ctx context.Context, account string) (Target, error) {
		a, err := LookupAccount(cc.Passwd, account)
		if err != nil {
			return nil, err
		}
		if a.UID == 0 && !cc.RootConsole {
			return nil, errors.New("a console never runs as root unless root's config allows it ([access] root_console)")
		}
		if a.Shell == "" || strings.HasSuffix(a.Shell, "/nologin") || strings.HasSuffix(a.Shell, "/false") || !filepath.IsAbs(a.Shell) {
			return nil, fmt.Errorf("account %s has no login shell (%q)", account, a.Shell)
		}
		euid := uint32(os.Geteuid())
		if euid != 0 && euid != a.UID {
			return nil, fmt.Errorf("a console as %s needs bcd node to run as root (it runs as uid %d)", account, euid)
		}
		cmd := exec.Command(a.Shell)
		cmd.Args = []string{"-" + filepath.Base(a.Shell)}
		cmd.Dir = a.Home
		if _, err := os.Stat(a.Home); err != nil {
			cmd.Dir = "/"
		}
		cmd.Env = []string{"HOME=" + a.Home, "USER=" + a.Name, "LOGNAME=" + a.Name, "SHELL=" + a.Shell,
			"PATH=/usr/local/bin:/usr/bin:/bin", "TERM=xterm-256color"}
		if a.UID == 0 {
			cmd.Env[4] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		}
		if euid == 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: a.UID, Gid: a.GID, Groups: []uint32{}}}
		}
		f, err := pty.StartWithAttrs(cmd, &pty.Winsize{Rows: 24, Cols: 80}, withCred(cmd.SysProcAttr))
		if err != nil {
			return nil, fmt.Errorf("starting %s's shell on a pseudo-terminal: %w", account, err)
		}
		return &ptyTarget{f: f, cmd: cmd}, nil
	}
}

// withCred is the attributes a console starts with: a session of its own
// with the terminal as its controlling one, and the account's credentials.
func withCred(a *syscall.SysProcAttr) *syscall.SysProcAttr {
	if a == nil {
		a = &syscall.SysProcAttr{}
	}
	a.Setsid, a.Setctty = true, true
	return a
}

type ptyTarget struct {
	f    *os.File
	cmd  *exec.Cmd
	once sync.Once
	err  error
}

func (p *ptyTarget) Read(b []byte) (int, error) {
	n, err := p.f.Read(b)
	if err != nil && errors.Is(err, syscall.EIO) {
		err = errEOF // the shell exited: the terminal's other side is gone
	}
	return n, err
}

func (p *ptyTarget) Write(b []byte) (int, error) { return p.f.Write(b) }
func (p *ptyTarget) CloseWrite() error           { return nil }
func (p *ptyTarget) Resize(rows, cols uint16) error {
	return pty.Setsize(p.f, &pty.Winsize{Rows: rows, Cols: cols})
}

// Close ends the shell (SIGHUP, as a closed terminal would; SIGKILL when
// it is still there 2 s later) and reaps it.
func (p *ptyTarget) Close() error {
	p.once.Do(func() {
		p.err = p.f.Close()
		if p.cmd.Process == nil {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGHUP)
		done := make(chan struct{})
		go func() { _, _ = p.cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
	return p.err
}
