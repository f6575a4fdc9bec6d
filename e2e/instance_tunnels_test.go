package e2e

import (
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/vm/libvirttest"
)

// TestInstanceConsoleThroughHelper: an unprivileged bcd node (a host
// build) beside a real bcd helper on a real libvirtd runs an instance;
// `bcgw console --instance vm-a` (the gateway finds the node) carries its
// serial console over the
// node's real mTLS session: the helper opened the pty as root and passed
// it to the node (libvirt.console in its log), and what the instance's
// firmware prints (SeaBIOS: its disk boots nothing) arrives at bcgw's
// standard output. The instance is added PAUSED and resumed once the
// console is open, so the firmware prints while bcgw reads. A console of
// an instance the node's spec does not run, and a tcp tunnel to an
// instance with no address under the network policy, are refused.
func TestInstanceConsoleThroughHelper(t *testing.T) {
	testenv.NeedRoot(t, "it creates a user, runs bcd helper and libvirtd as root")
	d := libvirttest.StartWith(t, libvirttest.Options{ReadOnlyForAll: true})
	l := newLab(t)
	digest, imageURL, pin := imageServer(t, l)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	base := sshdtest.Root(t)
	extra := fmt.Sprintf("\n[instances]\naccel = %q\nlibvirt_socket = %q\n", libvirttest.Accel(), d.Socket())
	hn := newHelperNode(t, l, g, base, "bcd-node-host", "", extra)
	helper := hn.root.start("bcd-helper", "helper", "--config", hn.cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	hn.asUser.start("bcd-node", "node", "--config", hn.cfg)
	l.waitNode(g, hn.id, "connected", func(n nodeView) bool { return n.Connected })
	l.bcgw(g, "ssh-ca", hn.id, "--jwks-only")

	l.bcgw(g, "instance", "add", hn.id, "--id", "vm-a", "--alloc", "alloc_a", "--image", digest+"="+imageURL,
		"--spki-pin", pin, "--memory-mib", "128", "--state", "PAUSED")
	l.waitStatus(g, hn.id, "vm-a paused", func(s adminapi.StatusView) bool {
		return section(s, "instances").State == "CONVERGED" && s.ObservedGeneration == s.SpecGeneration
	})
	if out, _ := d.Virsh(t, "domstate", "vm-a"); strings.TrimSpace(out) != "paused" {
		t.Fatalf("vm-a is %q, want paused", out)
	}

	_, out, se := l.startConsole(t, g, "vm-a")
	eventually(t, "the helper opened vm-a's console for the node", func() error {
		for _, o := range helperOps(t, helper.stderr.String()) {
			if o["op"] == "libvirt.console" && o["outcome"] == "ok" && o["uid"] == float64(hn.uid) {
				return nil
			}
		}
		return fmt.Errorf("no libvirt.console from the node in the helper's log (bcgw: %s)", se.String())
	})
	l.bcgw(g, "instance", "state", hn.id, "--id", "vm-a", "--state", "RUNNING")
	end := time.Now().Add(90 * time.Second)
	for !strings.Contains(out.String(), "SeaBIOS") && !strings.Contains(out.String(), "Booting from") && !strings.Contains(out.String(), "No bootable device") {
		if time.Now().After(end) {
			t.Fatalf("no firmware output through bcgw console in 90 s: %q (stderr %s)", out.String(), se.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("bcgw console --instance vm-a read %q", out.String())
	eventually(t, "bcd status lists the instance console tunnel", func() error {
		_, st, _ := hn.asUser.run("", nil, "bcd-node", "status", "--config", hn.cfg)
		if !strings.Contains(st, "console to instance vm-a") {
			return fmt.Errorf("bcd status:\n%s", st)
		}
		return nil
	})

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"console", hn.id, "--instance", "vm-nope"}, `runs no instance "vm-nope"`},
		{[]string{"console", "--instance", "vm-nope"}, "no node connected to this gateway"},
		{[]string{"tunnel", hn.id, "--instance", "vm-a", "--tcp", "80"}, "no address the loaded network policy binds"},
	} {
		code, _, errOut := l.run("", nil, "bcgw", append(c.args, "--data-dir", g.dataDir)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("bcgw %v: exit %d, %q; want a refusal with %q", c.args, code, errOut, c.want)
		}
	}
}

// startConsole runs bcgw console --instance id against g until the test
// ends: what is typed into stdin goes to the instance's serial console,
// what it prints arrives in out (bcgw's errors in se).
func (l *lab) startConsole(t *testing.T, g *gw, id string) (stdin io.WriteCloser, out, se *syncBuf) {
	t.Helper()
	cmd := exec.Command(filepath.Join(l.bin, "bcgw"), "console", "--instance", id, "--data-dir", g.dataDir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out = &syncBuf{name: "bcgw console --instance " + id + " (stdout)"}
	se = &syncBuf{name: "bcgw console --instance " + id + " (stderr)"}
	l.out.add(out)
	l.out.add(se)
	cmd.Stdout, cmd.Stderr = out, se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return stdin, out, se
}
