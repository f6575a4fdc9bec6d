package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
)

// sshLab is a lab under /run (sshd's StrictModes refuses files below
// /tmp) with bcgw, one fakehw node running as root whose access section
// writes under data/fakehw/root, Debian's sshd on a loopback port reading
// that root's configuration, and a throwaway local account.
type sshLab struct {
	*lab
	g          *gw
	cfg, id    string
	node       *proc
	root, acct string
	port       int
	keys       string
}

func newSSHLab(t *testing.T) *sshLab {
	testenv.NeedRoot(t, "sshd runs as root and a test account is created")
	testenv.NeedTool(t, "sshd", "openssh-server")
	testenv.NeedTool(t, "ssh", "openssh-client")
	l := &lab{t: t, bin: build(t), root: sshdtest.Root(t), out: &outputs{}}
	s := &sshLab{lab: l}
	s.g = l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	s.cfg, s.id = l.joinNode(s.g, "n", l.token(s.g, "--uses", "1"), "node")
	s.root = filepath.Join(filepath.Dir(s.cfg), "data", "fakehw", "root")
	s.port = sshdtest.FreePort(t)
	sshdtest.Config(t, s.root, s.port)
	// sshd reads a principals file as the account logging in: the node's
	// directories on the way must let others through (not read).
	for p := s.root; p != l.root; p = filepath.Dir(p) {
		os.Chmod(p, 0o711)
	}
	sshdtest.Start(t, s.root, s.port)
	s.acct = sshdtest.Account(t)
	// The node's ssh tunnels reach this sshd.
	b, err := os.ReadFile(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	setting := fmt.Sprintf("[access]\nssh_port = %d\n", s.port)
	if bytes.Contains(b, []byte("[access]\n")) {
		b = bytes.Replace(b, []byte("[access]\n"), []byte(setting), 1)
	} else {
		b = append(b, []byte("\n"+setting)...)
	}
	if err := os.WriteFile(s.cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s.keys = filepath.Join(l.root, "keys")
	os.Mkdir(s.keys, 0o700)
	s.node = l.start("bcd-node", "node", "--config", s.cfg)
	l.waitNode(s.g, s.id, "connected", func(n nodeView) bool { return n.Connected })
	return s
}

// sign has bcgw ssh-sign certify a new user key for principal and returns
// the key's path (its certificate beside it as NAME-cert.pub).
func (s *sshLab) sign(name, principal string, extra ...string) string {
	s.t.Helper()
	key := sshdtest.UserKey(s.t, s.keys, name)
	s.bcgw(s.g, append([]string{"ssh-sign", "--principal", principal, "--pubkey", key + ".pub"}, extra...)...)
	return key
}

// ssh runs `ssh ... ACCOUNT@127.0.0.1 id -un` with key and its certificate
// and the extra options, returning an error unless it logged in as the
// account.
func (s *sshLab) ssh(key string, extra ...string) error {
	args := sshdtest.SSHArgs(key, key+"-cert.pub", extra...)
	args = append(args, s.acct+"@127.0.0.1", "id -un")
	out, err := exec.Command("ssh", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != s.acct {
		return fmt.Errorf("logged in as %q, want %s", got, s.acct)
	}
	return nil
}

// eventually retries f for up to 30 s.
func eventually(t testing.TB, what string, f func() error) {
	t.Helper()
	eventuallyWithin(t, 30*time.Second, what, f)
}

// eventuallyWithin waits up to d for f to return nil.
func eventuallyWithin(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	var err error
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: not within %s: %v", what, d, err)
}

// TestSSHCAAgainstRealSSHD: bcgw ssh-ca puts the user CA and a node-bound
// principal into the node's access section, the node renders sshd's files
// and reloads the test's sshd, and a certificate from bcgw ssh-sign logs
// in directly on the loopback port; one for another node's principal, an
// expired one and a revoked one do not.
func TestSSHCAAgainstRealSSHD(t *testing.T) {
	s := newSSHLab(t)
	ca := strings.TrimSpace(s.bcgw(s.g, "ssh-ca", s.id, "--account", s.acct))
	if !strings.HasPrefix(ca, "ssh-ed25519 ") {
		t.Fatalf("bcgw ssh-ca printed %q", ca)
	}
	direct := []string{"-p", fmt.Sprint(s.port)}
	good := s.sign("good", s.id+":"+s.acct)
	eventually(t, "login with a certificate from bcgw ssh-sign", func() error { return s.ssh(good, direct...) })
	other := s.sign("other", "node_other:"+s.acct)
	if err := s.ssh(other, direct...); err == nil {
		t.Error("a certificate for another node's principal logged in")
	}
	expired := s.sign("expired", s.id+":"+s.acct, "--ttl", "1s")
	time.Sleep(2 * time.Second)
	if err := s.ssh(expired, direct...); err == nil {
		t.Error("an expired certificate logged in")
	}
	revoked := s.sign("revoked", s.id+":"+s.acct)
	if err := s.ssh(revoked, direct...); err != nil {
		t.Fatalf("before its revocation: %v", err)
	}
	serial := certSerial(t, revoked+"-cert.pub")
	s.bcgw(s.g, "ssh-ca", s.id, "--revoke", serial)
	eventually(t, "the revoked certificate refused", func() error {
		if s.ssh(revoked, direct...) == nil {
			return fmt.Errorf("serial %s still logs in", serial)
		}
		return nil
	})
	if err := s.ssh(good, direct...); err != nil {
		t.Fatalf("the good certificate after a revocation: %v", err)
	}
}

// certSerial reads a certificate's serial with ssh-keygen -L.
func certSerial(t *testing.T, cert string) string {
	out, err := exec.Command("ssh-keygen", "-L", "-f", cert).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen -L: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Serial: "); ok {
			return v
		}
	}
	t.Fatalf("no serial in %s", out)
	return ""
}

// proxy is ssh's ProxyCommand through bcgw tunnel to the node's sshd.
func (s *sshLab) proxy() []string {
	return []string{"-o", fmt.Sprintf("ProxyCommand=%s tunnel %s --ssh --data-dir %s", filepath.Join(s.bin, "bcgw"), s.id, s.g.dataDir)}
}

// TestSSHThroughTunnel: ssh with bcgw tunnel as its ProxyCommand reaches
// the node's loopback sshd and logs in with a certificate from bcgw
// ssh-sign; a revoked certificate, another node's principal and an
// expired one fail the same way; bcd status lists the open tunnel, and
// every open and close is a journal event with the ticket id, kind and
// account.
func TestSSHThroughTunnel(t *testing.T) {
	s := newSSHLab(t)
	s.bcgw(s.g, "ssh-ca", s.id, "--account", s.acct)
	good := s.sign("good", s.id+":"+s.acct)
	eventually(t, "login through bcgw tunnel", func() error { return s.ssh(good, s.proxy()...) })

	other := s.sign("other", "node_other:"+s.acct)
	if err := s.ssh(other, s.proxy()...); err == nil {
		t.Error("a certificate for another node's principal logged in through the tunnel")
	}
	expired := s.sign("expired", s.id+":"+s.acct, "--ttl", "1s")
	time.Sleep(2 * time.Second)
	if err := s.ssh(expired, s.proxy()...); err == nil {
		t.Error("an expired certificate logged in through the tunnel")
	}
	revoked := s.sign("revoked", s.id+":"+s.acct)
	s.bcgw(s.g, "ssh-ca", s.id, "--revoke", certSerial(t, revoked+"-cert.pub"))
	eventually(t, "the revoked certificate refused through the tunnel", func() error {
		if s.ssh(revoked, s.proxy()...) == nil {
			return errors.New("still logs in")
		}
		return nil
	})

	// bcd status lists a tunnel while it is open.
	args := sshdtest.SSHArgs(good, good+"-cert.pub", s.proxy()...)
	long := exec.Command("ssh", append(args, s.acct+"@127.0.0.1", "sleep 4")...)
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bcd status lists the open tunnel", func() error {
		_, out, _ := s.run("", nil, "bcd-node", "status", "--config", s.cfg, "--json")
		var st struct {
			Tunnels []struct {
				Kind    string `json:"kind"`
				Account string `json:"account"`
				JTI     string `json:"jti"`
			} `json:"tunnels"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return err
		}
		if len(st.Tunnels) != 1 || st.Tunnels[0].Kind != "ssh" || st.Tunnels[0].JTI == "" {
			return fmt.Errorf("tunnels %+v", st.Tunnels)
		}
		return nil
	})
	if err := long.Wait(); err != nil {
		t.Fatalf("ssh ... sleep 4: %v", err)
	}
	eventually(t, "tunnel events", func() error {
		out := s.bcgw(s.g, "events", s.id, "--json")
		if !strings.Contains(out, "tunnel.opened") || !strings.Contains(out, "tunnel.closed") || !strings.Contains(out, `"kind":"ssh"`) {
			return fmt.Errorf("events: %.2000s", out)
		}
		return nil
	})
	s.out.assertAbsent(t, "an exec ticket", ticketPrefix)
}
