package qemutests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/host/unit"
)

// The nvidia-driver unit in the systemd tier, against real apt and dpkg:
// a local apt repository the test builds with two versions of a stand-in
// nvidia-driver package. Each ships a real kernel module named nvidia
// that does nothing but report its version in /sys/module/nvidia/version
// (what the unit compares with the installed package), built once for
// the guest's kernel with the image (buildStandinModules), and a
// modules-load.d entry so the boot loads it, as udev would for a GPU.

// standinVersions are the stand-in driver's two upstream versions; the
// packages are VERSION-1.
var standinVersions = []string{"550.54.15", "550.90.07"}

// standinSource is the stand-in module: a name and a version.
const standinSource = `#include <linux/module.h>
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("bcd systemd tier: a stand-in nvidia module that only has a version");
MODULE_VERSION(BCD_VERSION);
`

// buildStandinModules builds the stand-in module once per version in the
// guest root (chroot, the kernel's headers and gcc from the guest's own
// Debian sources), writes each to out/VERSION/nvidia.ko and the kernel's
// release to out/kver, and purges what it installed for that.
func buildStandinModules(root, out string) error {
	mods, _ := filepath.Glob(filepath.Join(root, "lib/modules/*"))
	if len(mods) != 1 {
		return fmt.Errorf("the guest root has %d kernels in /lib/modules, want 1", len(mods))
	}
	kver := filepath.Base(mods[0])
	src := filepath.Join(root, "tmp/bcd-standin")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "nvidia.c"), []byte(standinSource), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(src, "Kbuild"), []byte("obj-m := nvidia.o\nccflags-y := -DBCD_VERSION=\\\"$(BCD_VERSION)\\\"\n"), 0o644); err != nil {
		return err
	}
	chroot := func(c string) (string, error) {
		cmd := exec.Command("chroot", root, "/bin/sh", "-ec", c)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
		o, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("in the guest root: %s: %v\n%s", c, err, tail(string(o), 3000))
		}
		return string(o), nil
	}
	before, err := chroot("dpkg-query -W -f='${Package}\\n'")
	if err != nil {
		return err
	}
	if _, err := chroot("apt-get install -y -q --no-install-recommends gcc make linux-headers-" + kver); err != nil {
		return err
	}
	for _, v := range standinVersions {
		if _, err := chroot(fmt.Sprintf("cd /tmp/bcd-standin && make -s -C /lib/modules/%s/build M=/tmp/bcd-standin BCD_VERSION=%s modules && strip --strip-debug nvidia.ko && test \"$(modinfo -F version nvidia.ko)\" = %s", kver, v, v)); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(out, v), 0o755); err != nil {
			return err
		}
		if o, err := exec.Command("cp", filepath.Join(src, "nvidia.ko"), filepath.Join(out, v, "nvidia.ko")).CombinedOutput(); err != nil {
			return fmt.Errorf("cp nvidia.ko: %v\n%s", err, o)
		}
		if _, err := chroot("cd /tmp/bcd-standin && make -s -C /lib/modules/" + kver + "/build M=/tmp/bcd-standin clean"); err != nil {
			return err
		}
	}
	after, err := chroot("dpkg-query -W -f='${Package}\\n'")
	if err != nil {
		return err
	}
	had := map[string]bool{}
	for _, p := range strings.Fields(before) {
		had[p] = true
	}
	var added []string
	for _, p := range strings.Fields(after) {
		if !had[p] {
			added = append(added, p)
		}
	}
	if _, err := chroot("apt-get purge -y -q " + strings.Join(added, " ") + " && apt-get clean && rm -rf /tmp/bcd-standin"); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "kver"), []byte(kver+"\n"), 0o644)
}

// standinRepo is the local apt repository in the guest; standinModule
// where the package puts the module (built for the guest's kernel).
const (
	standinRepo   = "/srv/bcd-test-apt"
	standinModule = "/usr/lib/bcd-test-nvidia/nvidia.ko"
)

// nvidiaCheck is the nvidia-driver part of the host step, one method per
// point of it, each self-contained.
type nvidiaCheck struct {
	e        *systemdEnv
	since    string // before the install
	dpkgLogN string // /var/log/dpkg.log's lines after the install
	calls    int    // host.unit nvidia-driver calls by the install
}

func pkgVersion(v string) string { return v + "-1" }

// newNvidiaCheck builds the two stand-in packages (dpkg-deb) and their
// repository (dpkg-scanpackages) on the host, copies them into the guest
// and adds the repository as an apt source there. The source is the
// operator's, as a host's apt sources are: the unit pins and installs
// from what the host's apt already has (docs/host.md).
func newNvidiaCheck(t *testing.T, e *systemdEnv) *nvidiaCheck {
	t.Helper()
	for _, tool := range [][2]string{{"dpkg-deb", "dpkg"}, {"dpkg-scanpackages", "dpkg-dev"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			need(t, tool[0]+" (apt-get install "+tool[1]+")", err)
		}
	}
	if _, err := os.Stat(filepath.Join(e.g.img.standin, "kver")); err != nil {
		t.Fatalf("the image's stand-in modules: %v", err)
	}
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if err := os.MkdirAll(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, v := range standinVersions {
		pkg := filepath.Join(dir, v)
		files := map[string]string{
			"DEBIAN/control": "Package: nvidia-driver\nVersion: " + pkgVersion(v) + "\nArchitecture: amd64\nMaintainer: bcd tests <tests@invalid>\n" +
				"Description: bcd systemd tier: a stand-in NVIDIA driver\n A kernel module named nvidia that only reports its version.\n",
			// modprobe nvidia (the test, and systemd-modules-load at
			// boot from the modules-load.d entry) runs the install
			// command: no depmod over the kernel's modules, which took
			// about 40 s in the postinst under TCG.
			"lib/modprobe.d/bcd-test-nvidia.conf":         "install nvidia /sbin/insmod " + standinModule + "\n",
			"usr/lib/modules-load.d/bcd-test-nvidia.conf": "nvidia\n",
		}
		for p, c := range files {
			full := filepath.Join(pkg, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ko := filepath.Join(pkg, standinModule)
		os.MkdirAll(filepath.Dir(ko), 0o755)
		if o, err := exec.Command("cp", filepath.Join(e.g.img.standin, v, "nvidia.ko"), ko).CombinedOutput(); err != nil {
			t.Fatalf("cp nvidia.ko: %v\n%s", err, o)
		}
		if o, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, filepath.Join(repo, "nvidia-driver_"+pkgVersion(v)+"_amd64.deb")).CombinedOutput(); err != nil {
			t.Fatalf("dpkg-deb --build: %v\n%s", err, o)
		}
	}
	scan := exec.Command("dpkg-scanpackages", "--multiversion", ".")
	scan.Dir = repo
	index, err := scan.Output()
	if err != nil {
		t.Fatalf("dpkg-scanpackages: %v", err)
	}
	if err := os.WriteFile(filepath.Join(repo, "Packages"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(repo)
	for _, f := range ents {
		if err := e.g.Copy(filepath.Join(repo, f.Name()), standinRepo+"/"+f.Name(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The guest is offline, so for this step its apt sources are the
	// local repository alone: apt reading Debian's index again (about
	// 50 s under TCG each time the lists change) would be most of the
	// step. Debian's source, lists and caches are put back at its end,
	// as the image had them (its apt cache still valid for later steps).
	const saved = "/var/lib/bcd-test-apt-saved"
	e.g.Must("mkdir -p " + saved + " && mv /etc/apt/sources.list " + saved + "/ && cp -a /var/lib/apt/lists " + saved + "/ && cp -a /var/cache/apt/srcpkgcache.bin /var/cache/apt/pkgcache.bin " + saved + "/")
	t.Cleanup(func() {
		if _, _, err := e.g.Run("rm -f /etc/apt/sources.list.d/bcd-test-nvidia.list && mv " + saved + "/sources.list /etc/apt/ && rm -rf /var/lib/apt/lists && mv " + saved + "/lists /var/lib/apt/ && mv " + saved + "/*.bin /var/cache/apt/ && rmdir " + saved); err != nil {
			t.Errorf("putting back the guest's apt sources: %v", err)
		}
	})
	if err := e.g.Put("/etc/apt/sources.list.d/bcd-test-nvidia.list", []byte("deb [trusted=yes] file:"+standinRepo+" ./\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &nvidiaCheck{e: e}
}

func (n *nvidiaCheck) spec(t *testing.T, v string) {
	t.Helper()
	gen := n.e.specPatch(t, `{"host":{"nvidia-driver":{"version":"`+pkgVersion(v)+`"}}}`)
	start := time.Now()
	n.e.waitSection(t, n.e.nodeID, gen, "host", "CONVERGED")
	t.Logf("nvidia-driver %s: host section CONVERGED at generation %d in %s", pkgVersion(v), gen, time.Since(start).Round(100*time.Millisecond))
}

// installed dpkg-queries the installed version.
func (n *nvidiaCheck) installed(t *testing.T) string {
	t.Helper()
	out, _, _ := n.e.g.Run("dpkg-query -W -f='${Status} ${Version}' nvidia-driver")
	return strings.TrimSpace(out)
}

func (n *nvidiaCheck) module(t *testing.T) string {
	t.Helper()
	out, _, _ := n.e.g.Run("cat /sys/module/nvidia/version")
	return strings.TrimSpace(out)
}

// driverReboot answers the RebootRequired conditions of nvidia-driver.
func (e *systemdEnv) driverReboot(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, c := range e.conditions(t) {
		if c.Type == "RebootRequired" && strings.Contains(c.Message, "nvidia-driver") {
			out = append(out, c.Message)
		}
	}
	return out
}

// install: the first version pinned and installed by the helper, through
// apt in its transient service; the test then loads the module as udev
// would for a GPU, and nothing asks for a reboot.
func (n *nvidiaCheck) install(t *testing.T) {
	g := n.e.g
	v := standinVersions[0]
	n.since = n.e.guestNow(t)
	n.spec(t, v)
	if got := n.installed(t); got != "install ok installed "+pkgVersion(v) {
		t.Fatalf("dpkg-query of nvidia-driver: %q, want %s installed", got, pkgVersion(v))
	}
	t.Logf("dpkg -s nvidia-driver:\n%s", g.Must("dpkg -s nvidia-driver | grep -E '^(Status|Version):'"))
	// The pin holds apt's candidate at the version although a newer one
	// is in the repository.
	policy := g.Must("apt-cache policy nvidia-driver")
	if !strings.Contains(policy, "Candidate: "+pkgVersion(v)) {
		t.Errorf("apt-cache policy nvidia-driver: the candidate is not the pinned %s:\n%s", pkgVersion(v), policy)
	}
	if pin := g.Must("cat " + unit.NvidiaPinFile); !strings.Contains(pin, "Pin: version "+pkgVersion(v)+"\n") {
		t.Errorf("%s:\n%s", unit.NvidiaPinFile, pin)
	}
	n.calls = n.unitCalls(t)
	if n.calls == 0 {
		t.Errorf("no host.unit nvidia-driver from the bcd account in the helper's journal:\n%s", n.e.journalSince(t, n.since, "-u bcd-helper.service"))
	}
	if j := n.e.journalSince(t, n.since, "-u "+unit.AptUnit); !strings.Contains(j, "Setting up nvidia-driver ("+pkgVersion(v)+")") {
		t.Errorf("apt-get's install is not in %s's journal:\n%s", unit.AptUnit, j)
	}
	t.Logf("%s's journal:\n%s", unit.AptUnit, g.Must("journalctl --no-pager -o short-monotonic --since "+n.since+" -u "+unit.AptUnit+" -u bcd-helper.service | grep -E 'Start|Finish|Setting up|host.unit|Reading package lists' | tail -n 20"))
	g.Must("modprobe nvidia")
	if m := n.module(t); m != v {
		t.Fatalf("/sys/module/nvidia/version %q after modprobe, want %s", m, v)
	}
	if c := n.e.driverReboot(t); len(c) != 0 {
		t.Errorf("RebootRequired from nvidia-driver with the installed module loaded: %q", c)
	}
	n.dpkgLogN = strings.TrimSpace(g.Must("wc -l < /var/log/dpkg.log"))
}

// secondPass, after a repair pass ran since install: nothing was sent to
// the helper again and dpkg did nothing.
func (n *nvidiaCheck) secondPass(t *testing.T) {
	if got := strings.TrimSpace(n.e.g.Must("wc -l < /var/log/dpkg.log")); got != n.dpkgLogN {
		t.Errorf("dpkg.log grew from %s to %s lines in a pass that had nothing to do:\n%s", n.dpkgLogN, got, n.e.g.Must("tail -n 20 /var/log/dpkg.log"))
	}
	if c := n.unitCalls(t); c != n.calls {
		t.Errorf("%d host.unit nvidia-driver calls since the install began, want the install's %d", c, n.calls)
	}
}

// unitCalls counts the helper's host.unit nvidia-driver calls from the
// bcd account since the install began.
func (n *nvidiaCheck) unitCalls(t *testing.T) int {
	t.Helper()
	calls := 0
	for _, o := range n.e.helperOps(t, n.since) {
		if o["op"] == "host.unit" && o["unit"] == "nvidia-driver" && fmt.Sprint(o["uid"]) == n.e.bcdUID {
			calls++
		}
	}
	return calls
}

// change: the second version installed while the first one's module is
// loaded: RebootRequired from nvidia-driver.
func (n *nvidiaCheck) change(t *testing.T) {
	old, v := standinVersions[0], standinVersions[1]
	n.spec(t, v)
	if got := n.installed(t); got != "install ok installed "+pkgVersion(v) {
		t.Fatalf("dpkg-query of nvidia-driver after the version change: %q, want %s installed", got, pkgVersion(v))
	}
	if m := n.module(t); m != old {
		t.Errorf("/sys/module/nvidia/version %q after the install, want the loaded %s", m, old)
	}
	var msgs []string
	waitFor(t, "RebootRequired from nvidia-driver", 2*time.Minute, func() bool { msgs = n.e.driverReboot(t); return len(msgs) > 0 })
	t.Logf("RebootRequired: %s", strings.Join(msgs, "; "))
}

// afterReboot: the boot loaded the installed module; no condition.
func (n *nvidiaCheck) afterReboot(t *testing.T) {
	v := standinVersions[1]
	if m := n.module(t); m != v {
		t.Errorf("/sys/module/nvidia/version %q after node.reboot, want %s", m, v)
	}
	if c := n.e.driverReboot(t); len(c) != 0 {
		t.Errorf("RebootRequired from nvidia-driver after node.reboot: %q", c)
	}
}

// removed: the pin goes with the unit; the package stays (nothing
// uninstalls a driver; docs/host.md).
func (n *nvidiaCheck) removed(t *testing.T) {
	if out, _, _ := n.e.g.Run("ls " + unit.NvidiaPinFile + " 2>/dev/null"); strings.TrimSpace(out) != "" {
		t.Errorf("%s left after the host section was removed", unit.NvidiaPinFile)
	}
	if got := n.installed(t); !strings.HasPrefix(got, "install ok installed ") {
		t.Errorf("nvidia-driver is %q after the host section was removed, want it left installed", got)
	}
}
