package libvirtrt

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/vm/rootvirt/rootvirttest"
	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	"github.com/better-compute/bcd/components/vm/vmruntime/runtimetest"
)

// TestRuntimeOnLibvirtd runs the shared runtime suite on a real libvirtd:
// reads through its read-only socket, changes through the root half.
func TestRuntimeOnLibvirtd(t *testing.T) {
	h := rootvirttest.New(t)
	d, data, qemuImg, basePath, host := h.D, h.Data, h.QEMUImg, h.BasePath, h.Root
	machine := func(id string) vmruntime.Machine {
		return vmruntime.InstanceMachine(id, 1, 64, h.Base, "qcow2", nil)
	}
	signed, ro := h.Signed, h.ReadOnlyURI()
	runtimetest.Run(t, runtimetest.Harness{
		Machine: machine,
		Setup: func(t *testing.T) runtimetest.Host {
			// One daemon for the suite: each subtest starts with no domain.
			out, _ := d.Virsh(t, "list", "--all", "--name")
			for _, name := range strings.Fields(out) {
				d.Virsh(t, "destroy", name)
				d.Virsh(t, "undefine", name)
			}
			for _, id := range []string{"vm-a", "vm-b", "byhand"} {
				dir := filepath.Join(data, "instances", id)
				os.RemoveAll(dir)
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-b", basePath, "-F", "qcow2", filepath.Join(dir, vmruntime.DiskFile)).CombinedOutput(); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
				if err := seed.WriteFile(filepath.Join(dir, vmruntime.SeedFile), seed.Seed{InstanceID: id}); err != nil {
					t.Fatal(err)
				}
			}
			return runtimetest.Host{
				New: func() vmruntime.Runtime {
					return New(Config{URI: ro, InstancesDir: filepath.Join(data, "instances"), Helper: rootvirttest.RootHalf{Host: host}, Signed: signed})
				},
				Foreign: func(id string) {
					p := filepath.Join(d.Dir, id+".xml")
					xml := fmt.Sprintf(`<domain type="qemu"><name>%s</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`, id)
					if err := os.WriteFile(p, []byte(xml), 0o600); err != nil {
						t.Fatal(err)
					}
					if _, err := d.Virsh(t, "define", p); err != nil {
						t.Fatal(err)
					}
				},
			}
		},
	})
}

func TestState(t *testing.T) {
	for in, want := range map[string]string{"running": "RUNNING", "paused": "PAUSED", "shut off": "STOPPED", "crashed": "STOPPED", "pmsuspended": "PAUSED", "in shutdown": "RUNNING"} {
		if got := State(in); got != want {
			t.Errorf("State(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestParseDomain: bcd's metadata makes a domain this node's when its
// own disks are in this node's instances directory, another node's when
// they are elsewhere (two nodes on one libvirtd); a definition without
// the metadata, or naming another instance, is no node's.
func TestParseDomain(t *testing.T) {
	def := `<domain type='qemu'><name>vm-a</name><metadata><bcd:instance xmlns:bcd="https://bcd.dev/xmlns/instance/v1" id="vm-a"/></metadata>
<memory unit='KiB'>131072</memory><vcpu placement='static'>2</vcpu><devices>
<disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/d/instances/vm-a/disk.qcow2'/><boot order='1'/></disk>
<disk type='file' device='cdrom'><driver name='qemu' type='raw'/><source file='/d/instances/vm-a/seed.iso'/><readonly/></disk>
</devices></domain>`
	m, owner, err := ParseDomain([]byte(def), "/d/instances")
	if err != nil || owner != ThisNode {
		t.Fatalf("ParseDomain = %v, %v", owner, err)
	}
	want := vmruntime.Machine{ID: "vm-a", VCPUs: 2, MemoryMiB: 128, Disks: []vmruntime.Disk{{Name: "disk.qcow2", Format: "qcow2", Boot: 1}, {Name: "seed.iso", Format: "raw", CDROM: true}}}
	if !m.Equal(want) {
		t.Errorf("machine %+v, want %+v", m, want)
	}
	for _, bad := range []string{strings.Replace(def, `id="vm-a"`, `id="vm-b"`, 1), strings.Replace(def, "bcd.dev", "evil.example", 2)} {
		if _, owner, err := ParseDomain([]byte(bad), "/d/instances"); err != nil || owner != NotBcd {
			t.Errorf("owner %v, %v for %s", owner, err, bad[:120])
		}
	}
	if _, owner, err := ParseDomain([]byte(def), "/d2/instances"); err != nil || owner != OtherNode {
		t.Errorf("owner %v, %v in another node's directory, want OtherNode", owner, err)
	}
}
