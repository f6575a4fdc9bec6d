// Package domainxml renders a libvirt domain from a typed request, for
// bcd helper to define as root: the instance id, vCPUs, memory, disks as
// file names in the instance's own directory, taps by name on allowed
// bridges, GPUs by UUID resolved against this host, kvm or qemu (TCG)
// acceleration and a serial console. The request has no field for
// anything else, so a rendered domain never carries qemu:commandline, a
// host block device, a filesystem, a custom emulator, kernel or loader,
// a seclabel or graphics. bcd's metadata names the instance, so the
// helper can tell the domains it rendered from those it did not.
//
// It renders text itself, with no XML library, to stay small: it is
// linked into bcd-helper, whose size is budgeted. docs/instances.md
// describes the domain.
package domainxml

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"

	"github.com/better-compute/bcd/components/helper/cdispec"
)

// Namespace is bcd's metadata namespace in a domain.
const Namespace = "https://bcd.dev/xmlns/instance/v1"

// Bounds of a request.
const (
	MaxVCPUs     = 512
	MinMemoryMiB = 64
	MaxMemoryMiB = 16 << 20 // 16 TiB
	MaxDisks     = 8
	MaxTaps      = 8
	MaxGPUs      = 16
)

// The accelerations: kvm in production; qemu (TCG) only where the host is
// configured for it.
const (
	KVM = "kvm"
	TCG = "qemu"
)

// Request is one instance's domain as the node asks for it.
type Request struct {
	ID string
	// UUID keeps a domain's libvirt UUID when it is defined again
	// (lowercase 8-4-4-4-12 hex); empty: libvirt picks one.
	UUID      string
	VCPUs     int
	MemoryMiB int
	Accel     string
	Disks     []Disk
	Taps      []Tap
	// GPUs are whole GPUs by UUID (GPU-...), passed through.
	GPUs []string
	// Node is the node the domain is rendered for, as root knows it (its
	// join record), written into bcd's metadata so that nodes sharing one
	// libvirtd each act only on their own domains; empty: none written.
	Node string
}

// Disk is a file in the instance's directory.
type Disk struct {
	// Name is the file's name: [a-z0-9][a-z0-9._-], 1 to 80.
	Name string `json:"name"`
	// Format is qcow2 or raw; a cdrom is raw.
	Format string `json:"format"`
	// CDROM attaches it read-only as a cdrom (the seed, an installer).
	CDROM bool `json:"cdrom,omitempty"`
	// Boot is its place in the boot order, from 1; 0: not booted from.
	Boot int `json:"boot,omitempty"`
	// Base: the file is a base image in the host's images directory,
	// named <sha256>.iso or <sha256>.raw, attached as a cdrom (an
	// installer). Name is then that file's name.
	Base bool `json:"base,omitempty"`
}

// Tap is a NIC: its tap device, created by libvirt on the bridge.
type Tap struct {
	// Name is the tap's interface name: [a-z0-9][a-z0-9-], 1 to 15.
	Name   string `json:"name"`
	Bridge string `json:"bridge"`
	// MAC is a unicast address, six lowercase hex pairs.
	MAC string `json:"mac"`
}

// PCI is a host PCI address.
type PCI struct {
	Domain              uint16
	Bus, Slot, Function uint8
}

// Host is what the renderer trusts about this host; the helper fills it
// from its own configuration and inventory, never from the request.
type Host struct {
	// InstancesDir holds one directory per instance id, where its disks
	// are: an absolute, clean path.
	InstancesDir string
	// ImagesDir holds the base images, <sha256>.<format>: an absolute,
	// clean path; needed only for Base disks.
	ImagesDir string
	// Bridges are the bridges a tap may join; none: no NIC at all.
	Bridges []string
	// GPU resolves a GPU UUID of this host to its PCI address; nil or
	// false: not this host's.
	GPU func(uuid string) (PCI, bool)
	// AllowTCG admits accel qemu (hosts where KVM is unusable).
	AllowTCG bool
}

// ValidID reports whether id may name an instance (its domain and its
// directory): [A-Za-z0-9][A-Za-z0-9_-]{0,63}.
func ValidID(id string) bool {
	return len(id) <= 64 && cdispec.ValidAllocation(id)
}

// ValidGPU reports whether g is a whole GPU's UUID: GPU- and 8 to 64 hex
// digits and dashes. A MIG instance cannot be passed through.
func ValidGPU(g string) bool {
	rest, ok := strings.CutPrefix(g, "GPU-")
	return ok && len(rest) >= 8 && len(rest) <= 64 && only(rest, "0123456789abcdefABCDEF-")
}

func only(s, set string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return !strings.ContainsRune(set, r) })
}

const lowerDigits = "abcdefghijklmnopqrstuvwxyz0123456789"

// name is [a-z0-9][a-z0-9<extra>]{0,max-1}.
func name(s string, max int, extra string) bool {
	return len(s) >= 1 && len(s) <= max && strings.ContainsRune(lowerDigits, rune(s[0])) && only(s, lowerDigits+extra)
}

func validUUID(u string) bool {
	if len(u) != 36 || !only(u, "0123456789abcdef-") {
		return false
	}
	for i, c := range u {
		if (i == 8 || i == 13 || i == 18 || i == 23) != (c == '-') {
			return false
		}
	}
	return true
}

func validMAC(m string) bool {
	if len(m) != 17 || !only(m, "0123456789abcdef:") {
		return false
	}
	for i := 2; i < 17; i += 3 {
		if m[i] != ':' {
			return false
		}
	}
	first, err := strconv.ParseUint(m[:2], 16, 8)
	return err == nil && first&1 == 0 && strings.Count(m, ":") == 5
}

// Check refuses a request the renderer would not render, saying why.
func (r Request) Check(h Host) error {
	switch {
	case !ValidID(r.ID):
		return fmt.Errorf("instance id %q is not [A-Za-z0-9][A-Za-z0-9_-], 1 to 64", r.ID)
	case r.Node != "" && !ValidID(r.Node):
		return fmt.Errorf("node %q is not [A-Za-z0-9][A-Za-z0-9_-], 1 to 64", r.Node)
	case r.UUID != "" && !validUUID(r.UUID):
		return fmt.Errorf("uuid %q is not lowercase 8-4-4-4-12 hex", r.UUID)
	case r.VCPUs < 1 || r.VCPUs > MaxVCPUs:
		return fmt.Errorf("vcpus %d: 1 to %d", r.VCPUs, MaxVCPUs)
	case r.MemoryMiB < MinMemoryMiB || r.MemoryMiB > MaxMemoryMiB:
		return fmt.Errorf("memory %d MiB: %d to %d", r.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	case r.Accel != KVM && r.Accel != TCG:
		return fmt.Errorf("accel %q is not kvm or qemu", r.Accel)
	case r.Accel == TCG && !h.AllowTCG:
		return fmt.Errorf("accel qemu (TCG) is not allowed on this host (only kvm)")
	case !cleanDir(h.InstancesDir):
		return fmt.Errorf("the instances directory %q is not an absolute, clean path below /", h.InstancesDir)
	case len(r.Disks) < 1 || len(r.Disks) > MaxDisks:
		return fmt.Errorf("%d disks: 1 to %d", len(r.Disks), MaxDisks)
	case len(r.Taps) > MaxTaps:
		return fmt.Errorf("%d taps: at most %d", len(r.Taps), MaxTaps)
	case len(r.GPUs) > MaxGPUs:
		return fmt.Errorf("%d GPUs: at most %d", len(r.GPUs), MaxGPUs)
	}
	seen := map[string]bool{}
	boots := map[int]bool{}
	for _, d := range r.Disks {
		switch {
		case !name(d.Name, 80, "._-"):
			return fmt.Errorf("disk %q is not a file name in the instance's directory ([a-z0-9][a-z0-9._-], 1 to 80)", d.Name)
		case seen[d.Name]:
			return fmt.Errorf("disk %s named twice", d.Name)
		case d.Format != "qcow2" && d.Format != "raw":
			return fmt.Errorf("disk %s: format %q is not qcow2 or raw", d.Name, d.Format)
		case d.CDROM && d.Format != "raw":
			return fmt.Errorf("disk %s: a cdrom is raw", d.Name)
		case d.Base && (!d.CDROM || !baseName(d.Name) || !cleanDir(h.ImagesDir)):
			return fmt.Errorf("disk %s: a base image is a cdrom named <sha256>.iso or .raw in the host's images directory", d.Name)
		case d.Boot < 0 || d.Boot > MaxDisks || d.Boot > 0 && boots[d.Boot]:
			return fmt.Errorf("disk %s: boot order %d is not free between 1 and %d", d.Name, d.Boot, MaxDisks)
		}
		seen[d.Name] = true
		boots[d.Boot] = d.Boot > 0
	}
	seen = map[string]bool{}
	for _, t := range r.Taps {
		switch {
		case !name(t.Name, 15, "-"):
			return fmt.Errorf("tap %q is not [a-z0-9][a-z0-9-], 1 to 15", t.Name)
		case seen[t.Name]:
			return fmt.Errorf("tap %s named twice", t.Name)
		case !contains(h.Bridges, t.Bridge) || !only(t.Bridge, lowerDigits+"ABCDEFGHIJKLMNOPQRSTUVWXYZ_.-") || len(t.Bridge) > 15:
			return fmt.Errorf("tap %s: bridge %q is not one this host lets instances join", t.Name, t.Bridge)
		case !validMAC(t.MAC):
			return fmt.Errorf("tap %s: MAC %q is not a unicast address in lowercase hex", t.Name, t.MAC)
		case seen[t.MAC]:
			return fmt.Errorf("tap %s: MAC %s given twice", t.Name, t.MAC)
		}
		seen[t.Name], seen[t.MAC] = true, true
	}
	seen = map[string]bool{}
	for _, g := range r.GPUs {
		if !ValidGPU(g) {
			return fmt.Errorf("GPU %q is not a GPU UUID", g)
		}
		if seen[strings.ToLower(g)] {
			return fmt.Errorf("GPU %s named twice", g)
		}
		seen[strings.ToLower(g)] = true
		if h.GPU == nil {
			return fmt.Errorf("GPU %s is not on this host", g)
		}
		if _, ok := h.GPU(g); !ok {
			return fmt.Errorf("GPU %s is not on this host", g)
		}
	}
	return nil
}

// cleanDir: an absolute, clean path below / without control characters.
func cleanDir(d string) bool {
	return filepath.IsAbs(d) && filepath.Clean(d) == d && d != "/" && !strings.ContainsFunc(d, unicode.IsControl)
}

// baseName is <64 lowercase hex>.iso or .raw.
func baseName(n string) bool {
	digest, ext, _ := strings.Cut(n, ".")
	return len(digest) == 64 && only(digest, "0123456789abcdef") && (ext == "iso" || ext == "raw")
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s && s != "" {
			return true
		}
	}
	return false
}

// DiskPath is where disk name of instance id lives.
func (h Host) DiskPath(id, name string) string {
	return h.InstancesDir + "/" + id + "/" + name
}

// Render checks the request and renders its domain.
func Render(r Request, h Host) ([]byte, error) {
	if err := r.Check(h); err != nil {
		return nil, fmt.Errorf("domain: %w", err)
	}
	var b strings.Builder
	w := func(parts ...string) {
		for _, p := range parts {
			b.WriteString(p)
		}
		b.WriteByte('\n')
	}
	itoa := strconv.Itoa
	w(`<domain type="`, r.Accel, `">`)
	w(`  <name>`, r.ID, `</name>`)
	if r.UUID != "" {
		w(`  <uuid>`, r.UUID, `</uuid>`)
	}
	w(`  <metadata>`)
	if r.Node != "" {
		w(`    <bcd:instance xmlns:bcd="`, Namespace, `" id="`, r.ID, `" node="`, r.Node, `"/>`)
	} else {
		w(`    <bcd:instance xmlns:bcd="`, Namespace, `" id="`, r.ID, `"/>`)
	}
	w(`  </metadata>`)
	w(`  <memory unit="MiB">`, itoa(r.MemoryMiB), `</memory>`)
	w(`  <vcpu placement="static">`, itoa(r.VCPUs), `</vcpu>`)
	w(`  <os>`)
	w(`    <type arch="x86_64" machine="q35">hvm</type>`)
	// The firmware writes to the serial port, the console bcd offers
	// (there is no graphics): SeaBIOS's messages and boot menu there.
	w(`    <bios useserial="yes"/>`)
	w(`  </os>`)
	w(`  <features><acpi/><apic/></features>`)
	if r.Accel == KVM {
		w(`  <cpu mode="host-passthrough" check="none" migratable="off"/>`)
	} else {
		// TCG: the most QEMU emulates, RDRAND included (entropy at boot).
		w(`  <cpu mode="maximum" check="none" migratable="off"/>`)
	}
	w(`  <clock offset="utc"/>`)
	w(`  <on_poweroff>destroy</on_poweroff>`)
	w(`  <on_reboot>restart</on_reboot>`)
	w(`  <on_crash>destroy</on_crash>`)
	w(`  <devices>`)
	vd, sd := 0, 0
	for _, d := range r.Disks {
		dev, target := "disk", `<target dev="vd`+string(rune('a'+vd))+`" bus="virtio"/>`
		if d.CDROM {
			dev, target = "cdrom", `<target dev="sd`+string(rune('a'+sd))+`" bus="sata"/>`
			sd++
		} else {
			vd++
		}
		w(`    <disk type="file" device="`, dev, `">`)
		w(`      <driver name="qemu" type="`, d.Format, `"/>`)
		src := h.DiskPath(r.ID, d.Name)
		if d.Base {
			src = h.ImagesDir + "/" + d.Name
		}
		w(`      <source file="`, escape(src), `"/>`)
		w(`      `, target)
		if d.CDROM {
			w(`      <readonly/>`)
		}
		if d.Boot > 0 {
			w(`      <boot order="`, itoa(d.Boot), `"/>`)
		}
		w(`    </disk>`)
	}
	for _, t := range r.Taps {
		w(`    <interface type="bridge">`)
		w(`      <mac address="`, t.MAC, `"/>`)
		w(`      <source bridge="`, t.Bridge, `"/>`)
		w(`      <target dev="`, t.Name, `"/>`)
		w(`      <model type="virtio"/>`)
		w(`    </interface>`)
	}
	for _, g := range r.GPUs {
		a, _ := h.GPU(g)
		w(`    <hostdev mode="subsystem" type="pci" managed="yes">`)
		w(`      <source><address domain="0x`, hex(uint64(a.Domain), 4), `" bus="0x`, hex(uint64(a.Bus), 2),
			`" slot="0x`, hex(uint64(a.Slot), 2), `" function="0x`, hex(uint64(a.Function), 1), `"/></source>`)
		w(`    </hostdev>`)
	}
	w(`    <serial type="pty"><target port="0"/></serial>`)
	w(`    <console type="pty"><target type="serial" port="0"/></console>`)
	w(`    <rng model="virtio"><backend model="random">/dev/urandom</backend></rng>`)
	w(`    <memballoon model="none"/>`)
	w(`  </devices>`)
	w(`</domain>`)
	return []byte(b.String()), nil
}

func hex(v uint64, width int) string {
	s := strconv.FormatUint(v, 16)
	return strings.Repeat("0", max(0, width-len(s))) + s
}

// escape makes s safe inside a double-quoted attribute. Only the host's
// own instances directory can carry such characters; everything from the
// request is checked to a narrow alphabet first.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;").Replace(s)
}

// IdentitySerial is the identity disk's virtio serial, by which the
// guest's hook knows it (the guest names a hot-added disk by its own
// order, not vdz).
const IdentitySerial = "bcd-identity"

// IdentityDisk renders the device libvirt.attach-disk hot-adds: file, a
// name in instance id's directory, as vdz, raw (never probed),
// read-only, with the serial IdentitySerial.
func IdentityDisk(host Host, id, file string) ([]byte, error) {
	if !ValidID(id) || !name(file, 80, "._-") || !cleanDir(host.InstancesDir) {
		return nil, fmt.Errorf("identity disk %q of %q: not an instance's disk", file, id)
	}
	return []byte(`<disk type="file" device="disk"><driver name="qemu" type="raw"/><source file="` + escape(host.DiskPath(id, file)) +
		`"/><target dev="vdz" bus="virtio"/><readonly/><serial>` + IdentitySerial + `</serial></disk>`), nil
}
