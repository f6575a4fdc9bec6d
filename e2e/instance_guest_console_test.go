package e2e

import (
	"fmt"
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

// TestConsoleTypesIntoGuest: a real Debian guest (guestimage) booted by
// an unprivileged bcd node through a real bcd helper on a real libvirtd;
// `bcgw console --instance vm-g`, opened while it boots, shows the
// guest's getty on its serial console (`login:`), and a user name typed
// into bcgw's standard input reaches it: the guest's getty echoes it and
// asks for the password.
func TestConsoleTypesIntoGuest(t *testing.T) {
	testenv.NeedRoot(t, "it creates a user, runs bcd helper and libvirtd as root")
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
	// Added PAUSED, so the console is open before the guest prints.
	l.bcgw(g, "instance", "add", hn.id, "--id", "vm-g", "--alloc", "alloc_g", "--image", digest+"="+imageURL,
		"--spki-pin", pin, "--memory-mib", "512", "--state", "PAUSED")
	l.waitStatus(g, hn.id, "vm-g paused", func(s adminapi.StatusView) bool {
		return section(s, "instances").State == "CONVERGED" && s.ObservedGeneration == s.SpecGeneration
	})
	cmd := exec.Command(filepath.Join(l.bin, "bcgw"), "console", "--instance", "vm-g", "--data-dir", g.dataDir)
	stdin, _ := cmd.StdinPipe()
	out := &syncBuf{name: "bcgw console --instance vm-g (stdout)"}
	se := &syncBuf{name: "bcgw console --instance vm-g (stderr)"}
	l.out.add(out)
	l.out.add(se)
	cmd.Stdout, cmd.Stderr = out, se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	eventually(t, "the helper opened vm-g's console", func() error {
		for _, o := range helperOps(t, helper.stderr.String()) {
			if o["op"] == "libvirt.console" && o["outcome"] == "ok" {
				return nil
			}
		}
		return fmt.Errorf("no libvirt.console in the helper's log (bcgw: %s)", se.String())
	})
	start := time.Now()
	l.bcgw(g, "instance", "state", hn.id, "--id", "vm-g", "--state", "RUNNING")
	wait := func(what string, limit time.Duration) {
		t.Helper()
		for end := time.Now().Add(limit); !strings.Contains(out.String(), what); time.Sleep(time.Second) {
			if time.Now().After(end) {
				t.Fatalf("no %q through bcgw console within %s; it read:\n%s", what, limit, out.String())
			}
		}
	}
	wait("login:", 10*time.Minute)
	t.Logf("vm-g: its getty's login prompt through bcgw console %s after it resumed", time.Since(start).Round(time.Second))
	if _, err := stdin.Write([]byte("bcdprobe\r")); err != nil {
		t.Fatal(err)
	}
	wait("Password:", 2*time.Minute)
	i := strings.LastIndex(out.String(), "login:")
	t.Logf("vm-g's console after the name was typed: %q", out.String()[max(i-40, 0):])
	if !strings.Contains(out.String()[i:], "bcdprobe") {
		t.Errorf("the guest did not echo the typed name after its prompt:\n%s", out.String()[i:])
	}
}
