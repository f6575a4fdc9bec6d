package domainxml

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/vm/libvirttest"
	"github.com/better-compute/bcd/components/vm/seed"
)

// TestLibvirtRunsRenderedDomain feeds a rendered domain to a real
// libvirtd (Debian's, started by libvirttest): a qcow2 disk that boots
// nothing and a NoCloud seed as a cdrom, under TCG here. libvirt defines
// it, keeps bcd's metadata, runs it, pauses, resumes, powers it off and
// undefines it.
func TestLibvirtRunsRenderedDomain(t *testing.T) {
	d := libvirttest.Start(t)
	qemuImg := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	h := Host{InstancesDir: filepath.Join(d.Dir, "instances"), AllowTCG: true}
	r := Request{ID: "tiny-1", VCPUs: 1, MemoryMiB: 64, Accel: libvirttest.Accel(), Node: "node_t1", Disks: []Disk{
		{Name: "disk.qcow2", Format: "qcow2", Boot: 1},
		{Name: "seed.iso", Format: "raw", CDROM: true},
	}}
	if err := os.MkdirAll(filepath.Join(h.InstancesDir, r.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", h.DiskPath(r.ID, "disk.qcow2"), "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	if err := seed.WriteFile(h.DiskPath(r.ID, "seed.iso"), seed.Seed{InstanceID: r.ID}); err != nil {
		t.Fatal(err)
	}
	b, err := Render(r, h)
	if err != nil {
		t.Fatal(err)
	}
	xmlPath := filepath.Join(d.Dir, "tiny-1.xml")
	if err := os.WriteFile(xmlPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	virsh := func(args ...string) string {
		t.Helper()
		out, err := d.Virsh(t, args...)
		if err != nil {
			t.Fatalf("%v\n%s", err, d.Log())
		}
		return strings.TrimSpace(out)
	}
	virsh("define", xmlPath)
	dump := virsh("dumpxml", r.ID)
	if !strings.Contains(dump, `<bcd:instance xmlns:bcd="`+Namespace+`" id="tiny-1" node="node_t1"/>`) {
		t.Errorf("libvirt's definition lost bcd's metadata:\n%s", dump)
	}
	if !strings.Contains(dump, `<domain type='`+r.Accel+`'`) {
		t.Errorf("libvirt's definition is not type %s:\n%s", r.Accel, dump)
	}
	for _, step := range []struct{ verb, state string }{
		{"start", "running"}, {"suspend", "paused"}, {"resume", "running"}, {"destroy", "shut off"},
	} {
		virsh(step.verb, r.ID)
		if got := virsh("domstate", r.ID); got != step.state {
			t.Fatalf("after %s: %q, want %q", step.verb, got, step.state)
		}
	}
	virsh("undefine", r.ID)
	if got := virsh("list", "--all", "--name"); got != "" {
		t.Errorf("after undefine libvirt lists %q", got)
	}
}
