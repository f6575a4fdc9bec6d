package domainxml

import (
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

const gpu = "GPU-5f1c0a2b-1111-2222-3333-444455556666"

var iso = strings.Repeat("a", 64) + ".iso"

func host() Host {
	return Host{
		InstancesDir: "/var/lib/bcd/instances",
		ImagesDir:    "/var/lib/bcd/images",
		Bridges:      []string{"br-inst"},
		GPU: func(u string) (PCI, bool) {
			return PCI{Bus: 0x3b, Slot: 0, Function: 0}, strings.EqualFold(u, gpu)
		},
	}
}

func request() Request {
	return Request{
		ID: "vm-1", VCPUs: 2, MemoryMiB: 2048, Accel: KVM, Node: "node_abc1",
		Disks: []Disk{{Name: "disk.qcow2", Format: "qcow2", Boot: 1}, {Name: "seed.iso", Format: "raw", CDROM: true}},
		Taps:  []Tap{{Name: "bcd-vm-1-0", Bridge: "br-inst", MAC: "52:54:00:12:34:56"}},
		GPUs:  []string{gpu},
	}
}

// TestRefusals: each check of Check, with the field that breaks it.
func TestRefusals(t *testing.T) {
	for _, tt := range []struct {
		name    string
		edit    func(*Request, *Host)
		wantErr string
	}{
		{"good", func(*Request, *Host) {}, ""},
		{"id injection", func(r *Request, _ *Host) { r.ID = `vm"/><qemu:commandline>` }, "instance id"},
		{"id path", func(r *Request, _ *Host) { r.ID = "../../etc" }, "instance id"},
		{"uuid", func(r *Request, _ *Host) { r.UUID = "5f1c0a2b-0000-4000-8000-0123456789ab" }, ""},
		{"no node", func(r *Request, _ *Host) { r.Node = "" }, ""},
		{"node injection", func(r *Request, _ *Host) { r.Node = `n" id="vm-2` }, "node"},
		{"uuid injection", func(r *Request, _ *Host) { r.UUID = `5f1c0a2b</uuid><qemu:commandline>` }, "uuid"},
		{"uuid upper", func(r *Request, _ *Host) { r.UUID = "5F1C0A2B-0000-4000-8000-0123456789AB" }, "uuid"},
		{"no vcpus", func(r *Request, _ *Host) { r.VCPUs = 0 }, "vcpus"},
		{"tiny memory", func(r *Request, _ *Host) { r.MemoryMiB = 1 }, "memory"},
		{"accel xen", func(r *Request, _ *Host) { r.Accel = "xen" }, "not kvm or qemu"},
		{"tcg not allowed", func(r *Request, _ *Host) { r.Accel = TCG }, "not allowed on this host"},
		{"tcg allowed", func(r *Request, h *Host) { r.Accel = TCG; h.AllowTCG = true }, ""},
		{"relative dir", func(_ *Request, h *Host) { h.InstancesDir = "instances" }, "absolute, clean"},
		{"unclean dir", func(_ *Request, h *Host) { h.InstancesDir = "/var/lib/../../etc" }, "absolute, clean"},
		{"no disk", func(r *Request, _ *Host) { r.Disks = nil }, "0 disks"},
		{"disk host path", func(r *Request, _ *Host) { r.Disks[0].Name = "/dev/sda" }, "not a file name"},
		{"disk up", func(r *Request, _ *Host) { r.Disks[0].Name = ".." }, "not a file name"},
		{"disk in subdir", func(r *Request, _ *Host) { r.Disks[0].Name = "a/b" }, "not a file name"},
		{"disk twice", func(r *Request, _ *Host) { r.Disks[1].Name = "disk.qcow2" }, "named twice"},
		{"disk vmdk", func(r *Request, _ *Host) { r.Disks[0].Format = "vmdk" }, "not qcow2 or raw"},
		{"qcow2 cdrom", func(r *Request, _ *Host) { r.Disks[1].Format = "qcow2" }, "a cdrom is raw"},
		{"boot twice", func(r *Request, _ *Host) { r.Disks[1].Boot = 1 }, "boot order"},
		{"base iso", func(r *Request, _ *Host) { r.Disks[1].Base, r.Disks[1].Name = true, iso }, ""},
		{"base not a cdrom", func(r *Request, _ *Host) { r.Disks[0].Base, r.Disks[0].Name, r.Disks[0].Format = true, iso, "raw" }, "a base image is a cdrom"},
		{"base not a digest", func(r *Request, _ *Host) { r.Disks[1].Base = true }, "a base image is a cdrom"},
		{"base qcow2", func(r *Request, _ *Host) { r.Disks[1].Base, r.Disks[1].Name = true, strings.Repeat("a", 64)+".qcow2" }, "a base image is a cdrom"},
		{"base without images dir", func(r *Request, h *Host) { r.Disks[1].Base, r.Disks[1].Name, h.ImagesDir = true, iso, "" }, "a base image is a cdrom"},
		{"tap long", func(r *Request, _ *Host) { r.Taps[0].Name = "tap-0123456789abcdef" }, "1 to 15"},
		{"tap foreign bridge", func(r *Request, _ *Host) { r.Taps[0].Bridge = "virbr0" }, "not one this host"},
		{"no bridges", func(_ *Request, h *Host) { h.Bridges = nil }, "not one this host"},
		{"multicast MAC", func(r *Request, _ *Host) { r.Taps[0].MAC = "01:00:5e:00:00:01" }, "unicast"},
		{"MAC upper", func(r *Request, _ *Host) { r.Taps[0].MAC = "52:54:00:AB:CD:EF" }, "lowercase"},
		{"GPU not here", func(r *Request, _ *Host) { r.GPUs = []string{"GPU-00000000-aaaa"} }, "not on this host"},
		{"GPU no inventory", func(_ *Request, h *Host) { h.GPU = nil }, "not on this host"},
		{"GPU twice", func(r *Request, _ *Host) { r.GPUs = append(r.GPUs, strings.ToUpper(gpu[4:])) }, "not a GPU UUID"},
		{"MIG", func(r *Request, _ *Host) { r.GPUs = []string{"MIG-5f1c0a2b"} }, "not a GPU UUID"},
	} {
		r, h := request(), host()
		tt.edit(&r, &h)
		_, err := Render(r, h)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: Render = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
}

// element is any element of a rendered domain, for walking it.
type element struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Children []element  `xml:",any"`
	Text     string     `xml:",chardata"`
}

func walk(e element, f func(path string, e element), path string) {
	path += "/" + e.XMLName.Local
	f(path, e)
	for _, c := range e.Children {
		walk(c, f, path)
	}
}

// TestRendered reads a rendered domain back with encoding/xml: it is well
// formed, its metadata names the instance once, its disks are the files
// of the instance's directory, and none of what the helper must never
// define is in it. Host values that need escaping are escaped.
func TestRendered(t *testing.T) {
	h := host()
	h.InstancesDir = `/srv/a&b"<c>`
	r := request()
	r.Disks = append(r.Disks, Disk{Name: iso, Format: "raw", CDROM: true, Base: true, Boot: 2})
	b, err := Render(r, h)
	if err != nil {
		t.Fatal(err)
	}
	var root element
	if err := xml.Unmarshal(b, &root); err != nil {
		t.Fatalf("rendered domain does not parse: %v\n%s", err, b)
	}
	var ids, nodes, sources []string
	walk(root, func(path string, e element) {
		for _, bad := range []string{"commandline", "filesystem", "emulator", "kernel", "initrd", "loader", "seclabel", "graphics", "qemu:"} {
			if strings.Contains(strings.ToLower(path), bad) {
				t.Errorf("rendered domain has %s", path)
			}
		}
		for _, a := range e.Attrs {
			switch {
			case path == "/domain/metadata/instance" && a.Name.Local == "id":
				if e.XMLName.Space != Namespace {
					t.Errorf("metadata in namespace %q", e.XMLName.Space)
				}
				ids = append(ids, a.Value)
			case path == "/domain/metadata/instance" && a.Name.Local == "node":
				nodes = append(nodes, a.Value)
			case path == "/domain/devices/disk/source":
				sources = append(sources, a.Value)
			case path == "/domain/devices/disk" && a.Name.Local == "type" && a.Value != "file":
				t.Errorf("a disk of type %s", a.Value)
			}
		}
	}, "")
	if len(ids) != 1 || ids[0] != "vm-1" {
		t.Errorf("metadata names %v, want vm-1 once", ids)
	}
	if len(nodes) != 1 || nodes[0] != "node_abc1" {
		t.Errorf("metadata names the node %v, want node_abc1 once", nodes)
	}
	want := []string{h.InstancesDir + "/vm-1/disk.qcow2", h.InstancesDir + "/vm-1/seed.iso", h.ImagesDir + "/" + iso}
	if strings.Join(sources, ",") != strings.Join(want, ",") {
		t.Errorf("disk sources %v, want %v", sources, want)
	}
}

// TestSchema validates rendered domains with libvirt's own schema
// (virt-xml-validate, libvirt-clients): kvm with every device kind, and
// TCG with none but a disk.
func TestSchema(t *testing.T) {
	bin := testenv.NeedTool(t, "virt-xml-validate", "libvirt-clients")
	tcg := Request{ID: "tcg_1", VCPUs: 1, MemoryMiB: 64, Accel: TCG, Disks: []Disk{{Name: "d.raw", Format: "raw", Boot: 1}}}
	h := host()
	h.AllowTCG = true
	for _, r := range []Request{request(), tcg} {
		b, err := Render(r, h)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), r.ID+".xml")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, p, "domain").CombinedOutput(); err != nil {
			t.Errorf("virt-xml-validate %s: %v\n%s\n%s", r.ID, err, out, b)
		}
	}
}
