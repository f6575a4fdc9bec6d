// Package swtpmtest starts a real software TPM (swtpm in socket mode on
// loopback) for tests in any package, and makes TPM states with EK
// certificates from swtpm_setup. Tests skip with a clear message where swtpm
// is not installed (and fail under CI, which installs it). Only tests may
// import it.
package swtpmtest

import (
	"bytes"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SWTPM is a software TPM the test started in socket mode on loopback.
type SWTPM struct {
	Dir  string // its state directory
	Addr string // its TCP command port (host:port)
	cmd  *exec.Cmd
	done chan struct{} // closed when swtpm has exited
	out  *lockedBuffer
}

// Need skips the test when swtpm is not installed, except under CI,
// which installs it.
func Need(t testing.TB) string {
	t.Helper()
	return testenv.NeedTool(t, "swtpm", "swtpm swtpm-tools")
}

// Start starts swtpm on the state in dir (a fresh one when dir is empty)
// and stops it when the test ends.
func Start(t testing.TB, dir string) *SWTPM {
	t.Helper()
	bin := Need(t)
	if dir == "" {
		dir = t.TempDir()
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := trySWTPM(bin, dir)
		if err == nil {
			t.Cleanup(s.Stop)
			return s
		}
		lastErr = err
	}
	t.Fatalf("start swtpm: %v", lastErr)
	return nil
}

func trySWTPM(bin, dir string) (*SWTPM, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	s := &SWTPM{Dir: dir, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), out: &lockedBuffer{}}
	s.cmd = exec.Command(bin, "socket", "--tpm2",
		"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", ports[0]),
		"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", ports[1]),
		"--flags", "not-need-init,startup-clear",
		"--tpmstate", "dir="+dir)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s = %w", s.cmd, err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return nil, fmt.Errorf("swtpm exited at start: %s", s.out.String())
		default:
		}
		// swtpm serves one connection at a time: probe the control port,
		// which it opens together with the command port.
		if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])), time.Second); err == nil {
			c.Close()
			// Another process may have taken the ports between freePorts and
			// the start, and answered the probe: a swtpm that could not bind
			// exits at once, so make sure ours is still running.
			select {
			case <-s.done:
				return nil, fmt.Errorf("swtpm exited at start (ports taken?): %s", s.out.String())
			case <-time.After(200 * time.Millisecond):
			}
			return s, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Stop()
	return nil, fmt.Errorf("swtpm did not listen on %s: %s", s.Addr, s.out.String())
}

// Stop ends swtpm (SIGTERM, so it writes its state; SIGKILL after 10 s).
func (s *SWTPM) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// freePorts finds n distinct free TCP ports on loopback.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// SetupEKCerts makes a TPM state in a new directory with RSA and ECC EK
// certificates from swtpm_setup, whose local CA lives in the test's own
// directory (not /var/lib/swtpm-localca). It answers the state directory
// and the local CA's certificate file (PEM), the EK CA.
func SetupEKCerts(t testing.TB) (state, caCert string) {
	t.Helper()
	Need(t)
	setup := testenv.NeedTool(t, "swtpm_setup", "swtpm-tools")
	localca := testenv.NeedTool(t, "swtpm_localca", "swtpm-tools")
	root := t.TempDir()
	state = filepath.Join(root, "state")
	ca := filepath.Join(root, "ca")
	for _, d := range []string{state, ca} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, body string) string {
		p := filepath.Join(root, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caConf := write("swtpm-localca.conf", fmt.Sprintf("statedir = %s\nsigningkey = %s/signkey.pem\nissuercert = %s/issuercert.pem\ncertserial = %s/certserial\n", ca, ca, ca, ca))
	caOpts := write("swtpm-localca.options", "--platform-manufacturer bcd-test\n--platform-version 2.1\n--platform-model swtpm\n")
	conf := write("swtpm_setup.conf", fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n", localca, caConf, caOpts))
	cmd := exec.Command(setup, "--tpm2", "--tpmstate", state, "--create-ek-cert", "--config", conf, "--overwrite")
	// swtpm_setup also reads $XDG_CONFIG_HOME; keep it inside the test.
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+root, "HOME="+root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s = %v\n%s", cmd, err, out)
	}
	return state, filepath.Join(ca, "issuercert.pem")
}

// lockedBuffer collects swtpm's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
