package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/vm/guestimage"
	"github.com/better-compute/bcd/components/vm/libvirttest"
)

// netnsEnv names the network namespace a test runs itself in again.
const netnsEnv = "BCD_E2E_NETNS"

// TestSSHToGuestThroughTunnel: `bcgw console --instance vm-s`, opened
// while the instance is PAUSED, shows the real Debian guest's
// (guestimage) getty once it booted, and a name typed into bcgw's
// standard input reaches it (echoed, then Password:). Then real ssh, with
// `bcgw tunnel --instance vm-s --ssh` as its ProxyCommand, logs in to the
// guest's real sshd. One boot serves both. Everything runs in a network
// namespace the
// test makes (the test runs itself again inside it): bcgw, an
// unprivileged host-build bcd node beside a real bcd helper, and a real
// libvirtd whose domain has its NIC, a tap named by TapName, on the
// bridge there under the policy the helper loaded with a real nft. The
// instance's user data gives the guest its address and root's key; the
// node dials the guest's own address, which the loaded policy binds.
func TestSSHToGuestThroughTunnel(t *testing.T) {
	testenv.NeedRoot(t, "it makes a network namespace, creates a user, runs bcd helper and libvirtd as root")
	if !inGuestNetNS(t, "TestSSHToGuestThroughTunnel", nil) {
		return
	}
	sshBin := testenv.NeedTool(t, "ssh", "openssh-client")
	keygen := testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	img := guestimage.Cached(t)
	d := libvirttest.StartWith(t, libvirttest.Options{ReadOnlyForAll: true})
	l := newLab(t)
	digest, imageURL, pin := fileServer(t, img.Path, img.SHA256)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	base := sshdtest.Root(t)
	extra := fmt.Sprintf("\n[instances]\naccel = %q\nlibvirt_socket = %q\n", libvirttest.Accel(), d.Socket())
	hn := newHelperNode(t, l, g, base, "bcd-node-host", "", extra)
	helper := hn.root.start("bcd-helper", "helper", "--config", hn.cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	hn.asUser.start("bcd-node", "node", "--config", hn.cfg)
	l.waitNode(g, hn.id, "connected", func(n nodeView) bool { return n.Connected })
	l.bcgw(g, "ssh-ca", hn.id, "--jwks-only")

	key, pub := l.userKey(t, keygen)
	ud := filepath.Join(l.root, "user-data")
	if err := os.WriteFile(ud, []byte("#cloud-config\nruncmd:\n  - ip link set eth0 up\n  - ip addr add 10.9.0.5/24 dev eth0\n"+
		"  - mkdir -p /root/.ssh && echo '"+strings.TrimSpace(string(pub))+"' > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys\n"+
		"  - echo bcd-guest-ready > /dev/ttyS0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "secret", "set", "instance-user-data/alloc_s", "--node", hn.id, "--value-file", ud)
	// PAUSED first, so the console is open before the guest prints.
	l.bcgw(g, "spec", "patch", hn.id, "--file", l.specFile("vm-s.json", fmt.Sprintf(`{"instances":{
 "images":[{"sha256":%q,"url":%q,"format":"qcow2","spki_pin":%q}],
 "instances":[{"id":"vm-s","allocation":"alloc_s","state":"PAUSED","vcpus":1,"memory_mib":512,"image":%q,"user_data":true,
  "nics":[{"bridge":"br0","mac":"52:54:00:0a:00:05","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]}]}}`, digest, imageURL, pin, digest)))
	converged := func(what string) {
		l.waitStatus(g, hn.id, what, func(s adminapi.StatusView) bool {
			return section(s, "instances").State == "CONVERGED" && s.ObservedGeneration == s.SpecGeneration
		})
	}
	converged("vm-s paused")
	stdin, out, se := l.startConsole(t, g, "vm-s")
	eventually(t, "the helper opened vm-s's console", func() error {
		for _, o := range helperOps(t, helper.stderr.String()) {
			if o["op"] == "libvirt.console" && o["outcome"] == "ok" {
				return nil
			}
		}
		return fmt.Errorf("no libvirt.console in the helper's log (bcgw: %s)", se.String())
	})
	start := time.Now()
	l.bcgw(g, "instance", "state", hn.id, "--id", "vm-s", "--state", "RUNNING")
	converged("vm-s running")
	wait := func(what string, limit time.Duration) {
		t.Helper()
		for end := time.Now().Add(limit); !strings.Contains(out.String(), what); time.Sleep(time.Second) {
			if time.Now().After(end) {
				t.Fatalf("no %q through bcgw console within %s; it read:\n%s", what, limit, out.String())
			}
		}
	}
	wait("login:", 12*time.Minute)
	t.Logf("vm-s: its getty's login prompt through bcgw console %s after it resumed", time.Since(start).Round(time.Second))
	if _, err := stdin.Write([]byte("bcdprobe\r")); err != nil {
		t.Fatal(err)
	}
	wait("Password:", 2*time.Minute)
	i := strings.LastIndex(out.String(), "login:")
	t.Logf("vm-s's console after the name was typed: %q", out.String()[max(i-40, 0):])
	if !strings.Contains(out.String()[i:], "bcdprobe") {
		t.Errorf("the guest did not echo the typed name after its prompt:\n%s", out.String()[i:])
	}

	proxy := fmt.Sprintf("%s tunnel --instance vm-s --ssh --data-dir %s", filepath.Join(l.bin, "bcgw"), g.dataDir)
	var last []byte
	for end := time.Now().Add(5 * time.Minute); ; time.Sleep(5 * time.Second) {
		cmd := exec.Command(sshBin, "-o", "ProxyCommand="+proxy, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
			"-o", "BatchMode=yes", "-o", "ConnectTimeout=60", "-i", key, "root@vm-s", "echo bcd-ssh-ok $(hostname) $(id -u)")
		out, err := cmd.CombinedOutput()
		if err == nil && strings.Contains(string(out), "bcd-ssh-ok vm-s 0") {
			t.Logf("ssh through bcgw tunnel --instance vm-s --ssh: %q, %s after the instance resumed", strings.TrimSpace(string(out)), time.Since(start).Round(time.Second))
			break
		}
		last = out
		if time.Now().After(end) {
			t.Fatalf("no ssh login to vm-s through the tunnel within 5 minutes of its login prompt; last: %v\n%s", err, last)
		}
	}
	eventually(t, "the node's journal has the instance tunnel", func() error {
		_, st, _ := hn.asUser.run("", nil, "bcd-node", "status", "--config", hn.cfg)
		if !strings.Contains(st, "taps") || !strings.Contains(st, "vm-s PRIVATE GUARDED") {
			return fmt.Errorf("bcd status:\n%s", st)
		}
		return nil
	})
}

// userKey makes the ed25519 key pair a test logs in to a guest with (no
// passphrase) with keygen, in the lab's root: its private key's path and
// its public key.
func (l *lab) userKey(t *testing.T, keygen string) (string, []byte) {
	t.Helper()
	key := filepath.Join(l.root, "id_ed25519")
	if out, err := exec.Command(keygen, "-q", "-t", "ed25519", "-N", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return key, pub
}
