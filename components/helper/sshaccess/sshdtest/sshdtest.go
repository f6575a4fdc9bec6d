// Package sshdtest runs Debian's real sshd for tests: as root, on a
// loopback port, with its own configuration under a root directory that
// includes the drop-in directory bcd writes to, and creates a throwaway
// local account to log in as. Tests of the access section and of tunnels
// use it; nothing else imports it.
package sshdtest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// SSHD is one running sshd.
type SSHD struct {
	Root string // its file table root: etc/ssh/sshd_config, run/sshd.pid
	Port int
	Cmd  *exec.Cmd
	Log  *strings.Builder
}

// Config writes root/etc/ssh/sshd_config (listening on 127.0.0.1:port,
// its own host key, pid file root/run/sshd.pid, root/etc/ssh/sshd_config.d
// included first, public keys only, no password) and returns its path.
// extra lines are appended.
func Config(t testing.TB, root string, port int, extra ...string) string {
	t.Helper()
	for _, d := range []string{"etc/ssh/sshd_config.d", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := filepath.Join(root, "etc/ssh/host_ed25519")
	if _, err := os.Stat(key); err != nil {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen host key: %v: %s", err, out)
		}
	}
	// Debian's sshd refuses to run (even -t) without its privilege
	// separation directory, which ssh.service creates.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`Include %s/etc/ssh/sshd_config.d/*.conf
ListenAddress 127.0.0.1:%d
HostKey %s
PidFile %s/run/sshd.pid
AuthorizedKeysFile none
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
LogLevel VERBOSE
`, root, port, key, root) + strings.Join(extra, "\n") + "\n"
	p := filepath.Join(root, "etc/ssh/sshd_config")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePort is a loopback TCP port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start runs sshd -D -e on root's configuration (written by Config) until
// the test ends; it waits until the port accepts connections.
func Start(t testing.TB, root string, port int) *SSHD {
	t.Helper()
	testenv.NeedRoot(t, "sshd runs as root to log a test account in")
	sshd := testenv.NeedTool(t, "sshd", "openssh-server")
	if !filepath.IsAbs(sshd) {
		sshd, _ = filepath.Abs(sshd)
	}
	s := &SSHD{Root: root, Port: port, Log: &strings.Builder{}}
	s.Cmd = exec.Command(sshd, "-D", "-e", "-f", filepath.Join(root, "etc/ssh/sshd_config"))
	s.Cmd.Stderr = &lockedWriter{b: s.Log}
	if err := s.Cmd.Start(); err != nil {
		t.Fatalf("starting sshd: %v", err)
	}
	t.Cleanup(func() {
		s.Cmd.Process.Kill()
		s.Cmd.Wait()
		if t.Failed() {
			t.Logf("sshd's log:\n%s", s.Logs())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd did not listen on 127.0.0.1:%d: %v\n%s", port, err, s.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Account creates a local account (uid from 1000 up, a home, /bin/sh, a
// password that is unusable but not locked, so sshd without PAM lets a key
// in) and removes it when the test ends.
func Account(t testing.TB) string {
	t.Helper()
	testenv.NeedRoot(t, "it creates a local account with useradd")
	for _, tool := range []string{"useradd", "userdel", "usermod"} {
		testenv.NeedTool(t, tool, "passwd")
	}
	b := make([]byte, 4)
	rand.Read(b)
	name := "bcdssh" + hex.EncodeToString(b)
	if out, err := exec.Command("useradd", "--create-home", "--shell", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", "--remove", name).Run() })
	if out, err := exec.Command("usermod", "-p", "*", name).CombinedOutput(); err != nil {
		t.Fatalf("usermod: %v: %s", err, out)
	}
	return name
}

// UserKey creates a user key pair in dir and returns the private key's
// path (the public key is path + ".pub").
func UserKey(t testing.TB, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", p).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	return p
}

// SSHArgs are ssh's options for a test login: no agent, no known hosts,
// no other identity, the certificate and key given, batch mode.
func SSHArgs(key, cert string, extra ...string) []string {
	args := []string{"-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		"-o", "ConnectTimeout=10", "-i", key, "-o", "CertificateFile=" + cert}
	return append(args, extra...)
}

// lockedWriter lets sshd's stderr and the test read the log at once.
type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// Root makes a root directory for sshd's files under /run (root's, closed
// to others: sshd's StrictModes refuses a principals file below a
// world-writable directory such as /tmp) and removes it when the test ends.
func Root(t testing.TB) string {
	t.Helper()
	testenv.NeedRoot(t, "sshd's files live in a directory under /run")
	d, err := os.MkdirTemp("/run", "bcd-sshd-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Logs is what sshd logged so far.
func (s *SSHD) Logs() string {
	w := s.Cmd.Stderr.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
