package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/guestimage"
	"github.com/better-compute/bcd/components/vm/libvirttest"
)

// TestInstancesOnLibvirtThroughHelper: an unprivileged bcd node (a host
// build, as a throwaway account) beside a real bcd helper (root) on a
// real libvirtd (libvirttest). bcgw instance add puts an instance with
// user data on it, its base the Debian guest of guestimage (a qcow2 that
// boots on its own with SeaBIOS) served over https on loopback through
// its pin; the node is killed (SIGKILL) while it sets the instance up
// and started again: one domain, defined by the helper from the signed
// section, with bcd's metadata, under TCG as root's [instances] accel
// says. The guest boots and real cloud-init runs the allocation's user
// data from the seed: its runcmd prints the SHA-256 of a nonce on the
// serial console, where the test reads it. Then PAUSED, RUNNING, STOPPED
// as libvirt reports them, and removal: the domain undefined, the
// instance's directory removed, the base image gone once no instance
// names it. A domain defined by hand with virsh is reported and stays as
// it was.
func TestInstancesOnLibvirtThroughHelper(t *testing.T) {
	testenv.NeedRoot(t, "it creates a user, runs bcd helper and libvirtd as root")
	img := guestimage.Cached(t)
	d := libvirttest.StartWith(t, libvirttest.Options{ReadOnlyForAll: true})
	l := newLab(t)
	digest, imageURL, pin := fileServer(t, img.Path, img.SHA256)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	// Root's own directory: the helper refuses a configuration under
	// a directory others can write (/tmp).
	base := sshdtest.Root(t)
	extra := fmt.Sprintf("\n[instances]\naccel = %q\nlibvirt_socket = %q\n", libvirttest.Accel(), d.Socket())
	hn := newHelperNode(t, l, g, base, "bcd-node-host", "", extra)
	helper := hn.root.start("bcd-helper", "helper", "--config", hn.cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	node := hn.asUser.start("bcd-node", "node", "--config", hn.cfg)
	l.waitNode(g, hn.id, "connected", func(n nodeView) bool { return n.Connected })

	virsh := func(args ...string) string {
		t.Helper()
		out, err := d.Virsh(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, d.Log())
		}
		return strings.TrimSpace(out)
	}
	byhand := filepath.Join(l.root, "byhand.xml")
	if err := os.WriteFile(byhand, []byte(`<domain type="qemu"><name>byhand</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`), 0o600); err != nil {
		t.Fatal(err)
	}
	virsh("define", byhand)
	handDef := virsh("dumpxml", "--inactive", "byhand")

	// The user data: cloud-init's runcmd prints the nonce's SHA-256,
	// which the guest computes, so only a command that ran prints it.
	nonce := randHex(t, 16)
	proofSum := sha256.Sum256([]byte(nonce))
	proof := "bcd-proof " + hex.EncodeToString(proofSum[:])
	ud := filepath.Join(l.root, "user-data")
	if err := os.WriteFile(ud, []byte("#cloud-config\nruncmd:\n  - echo \"bcd-proof $(printf %s "+nonce+" | sha256sum | cut -c1-64)\" > /dev/ttyS0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "secret", "set", "instance-user-data/alloc_a", "--node", hn.id, "--value-file", ud)
	console := d.ReadConsole(t, "vm-a")
	l.bcgw(g, "instance", "add", hn.id, "--id", "vm-a", "--alloc", "alloc_a", "--image", digest+"="+imageURL,
		"--spki-pin", pin, "--memory-mib", "512", "--user-data")
	// Kill the node while it sets the instance up: once its directory
	// is there, or the image is being fetched.
	data := hn.dataDir
	end := time.Now().Add(60 * time.Second)
	for time.Now().Before(end) {
		if es, _ := os.ReadDir(filepath.Join(data, "images", "tmp")); len(es) > 0 {
			break
		}
		if _, err := os.Stat(filepath.Join(data, "instances", "vm-a")); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	node.signal(syscall.SIGKILL)
	node.wait(t, 10*time.Second)
	hn.asUser.start("bcd-node", "node", "--config", hn.cfg)

	waitState := func(want string) {
		t.Helper()
		st := l.waitStatus(g, hn.id, "instances "+want, func(s adminapi.StatusView) bool {
			return section(s, "instances").State == "CONVERGED" && s.ObservedGeneration == s.SpecGeneration
		})
		if got := virsh("domstate", "vm-a"); got != want {
			t.Fatalf("vm-a is %q, want %q (status %+v)", got, want, section(st, "instances"))
		}
	}
	// The first time: the node fetches the image (about 1 GiB) again
	// after the kill, checks it and makes the disk.
	eventuallyWithin(t, 3*time.Minute, "vm-a defined and running", func() error {
		st := l.gwStatus(g, hn.id)
		if section(st, "instances").State != "CONVERGED" || st.ObservedGeneration != st.SpecGeneration {
			return fmt.Errorf("instances: %+v", section(st, "instances"))
		}
		return nil
	})
	waitState("running")
	if got := virsh("list", "--all", "--name"); strings.Join(strings.Fields(got), " ") != "vm-a byhand" && strings.Join(strings.Fields(got), " ") != "byhand vm-a" {
		t.Fatalf("domains %q, want vm-a and byhand", got)
	}
	if def := virsh("dumpxml", "vm-a"); !strings.Contains(def, `id="vm-a"`) || !strings.Contains(def, "<domain type='"+libvirttest.Accel()+"'") {
		t.Errorf("vm-a's definition:\n%s", def)
	}
	defined := 0
	for _, o := range helperOps(t, helper.stderr.String()) {
		if o["op"] == "libvirt.define" && o["outcome"] == "ok" && o["uid"] == float64(hn.uid) {
			defined++
		}
	}
	if defined == 0 {
		t.Fatalf("no libvirt.define from the node in the helper's log:\n%s", helper.stderr.String())
	}

	// The guest boots from its disk and cloud-init runs the user data.
	if !console.Wait(proof, 10*time.Minute) {
		t.Fatalf("no %q on vm-a's console within 10 minutes of its start; the console:\n%s", proof, console.String())
	}
	t.Logf("vm-a: the user data's proof on the console %s after it was opened (the domain's start)", time.Since(console.Opened()).Round(time.Second))
	if console.Wait("finished at", 2*time.Minute) {
		t.Logf("vm-a: cloud-init finished %s after the domain's start", time.Since(console.Opened()).Round(time.Second))
	}

	// bcd status lists the domains, the hand-made one as not bcd's.
	eventually(t, "bcd status lists the domains", func() error {
		_, out, errOut := hn.asUser.run("", nil, "bcd-node", "status", "--config", hn.cfg)
		if !strings.Contains(out, "instances   2, complete") || !strings.Contains(out, "  vm-a RUNNING\n") || !strings.Contains(out, "  byhand STOPPED not bcd's") {
			return fmt.Errorf("bcd status:\n%s%s", out, errOut)
		}
		return nil
	})

	for _, step := range []struct{ state, want string }{{"PAUSED", "paused"}, {"RUNNING", "running"}, {"STOPPED", "shut off"}} {
		l.bcgw(g, "instance", "state", hn.id, "--id", "vm-a", "--state", step.state)
		waitState(step.want)
	}
	if out := l.bcgw(g, "instances", hn.id); !strings.Contains(out, "byhand") || !strings.Contains(out, "vm-a") {
		t.Errorf("bcgw instances:\n%s", out)
	}

	l.bcgw(g, "instance", "remove", hn.id, "--id", "vm-a")
	l.waitStatus(g, hn.id, "instances removed", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == s.SpecGeneration && section(s, "instances").State == "CONVERGED"
	})
	if got := virsh("list", "--all", "--name"); got != "byhand" {
		t.Errorf("domains after removal %q, want byhand alone", got)
	}
	for _, p := range []string{filepath.Join(data, "instances", "vm-a"), filepath.Join(data, "images", digest+".qcow2")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", p, err)
		}
	}
	if got := virsh("dumpxml", "--inactive", "byhand"); got != handDef {
		t.Errorf("the domain defined by hand changed:\n%s", got)
	}
}

// fileServer serves the file at path, whose SHA-256 is digest, over https
// on loopback, and returns its URL and the server's pin.
func fileServer(t *testing.T, path, digest string) (string, string, string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		http.ServeContent(w, r, filepath.Base(path), time.Time{}, f)
	}))
	t.Cleanup(srv.Close)
	return digest, srv.URL + "/" + filepath.Base(path), pki.PinOfCert(srv.Certificate())
}
