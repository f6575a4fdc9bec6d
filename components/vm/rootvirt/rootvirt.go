// Package rootvirt is the instances' root half: bcd helper's libvirt.*
// operations. libvirt.define takes the instance from the instances
// section root verified (vCPUs, memory, image, GPUs), builds its disks
// as the node's converger does (vmruntime.InstanceMachine), checks every
// disk file as root (a regular file of the node's uid with one link, no
// symlink on the way, a qcow2 header naming no backing file but its
// recorded base, no data file, no encryption), resolves GPUs against
// this host's own, renders the domain itself (components/vm/domainxml)
// and defines it. Every operation acts only on a domain bcd's metadata
// names; a domain bcd did not create is never touched. Nothing here
// parses domain XML: ownership is libvirt's own answer for bcd's
// metadata namespace. docs/instances.md, "Through bcd helper".
package rootvirt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Ops implements helper.Libvirt.
type Ops struct{}

var _ helper.Libvirt = Ops{}

// section is what root reads of the instances section: only the fields
// a domain is made of. The section's signature was checked before.
type section struct {
	Images []struct {
		SHA256 string `json:"sha256"`
		Format string `json:"format"`
	} `json:"images"`
	Instances []struct {
		ID        string          `json:"id"`
		VCPUs     int             `json:"vcpus"`
		MemoryMiB int             `json:"memory_mib"`
		Image     string          `json:"image"`
		GPUs      []string        `json:"gpus"`
		NICs      []netpolicy.NIC `json:"nics"`
		// RestoreFrom: the disk's base is the snapshot's, unpacked by
		// the node under data_dir/snapshots/<sha256>.d.
		RestoreFrom *struct {
			SHA256 string `json:"sha256"`
			Memory bool   `json:"memory"`
		} `json:"restore_from"`
	} `json:"instances"`
}

// refusal is an error retrying cannot mend.
type refusal struct{ error }

func refuse(format string, args ...any) error { return refusal{fmt.Errorf(format, args...)} }

func result(err error) (bool, error) {
	var r refusal
	return errors.As(err, &r), err
}

// Define renders instance id's domain from the verified section and
// defines it: a new domain, or again over one bcd's metadata names
// (keeping its UUID).
func (Ops) Define(ctx context.Context, h helper.LibvirtHost, id string, body []byte) (bool, error) {
	return result(define(ctx, h, id, body))
}

func define(ctx context.Context, h helper.LibvirtHost, id string, body []byte) error {
	xml, _, err := render(ctx, h, id, body)
	if err != nil {
		return err
	}
	_, err = h.Virsh(ctx, xml, "define", "/dev/stdin")
	return err
}

// render renders instance id's domain from the verified section, its
// disks and taps checked, keeping the UUID of bcd's domain of that name
// (found reports there is one).
func render(ctx context.Context, h helper.LibvirtHost, id string, body []byte) (xml []byte, found bool, err error) {
	var sec section
	if err := json.Unmarshal(body, &sec); err != nil {
		return nil, false, refuse("the instances section: %v", err)
	}
	var m *vmruntime.Machine
	var image, format string
	var base qcow2.Backing
	for _, in := range sec.Instances {
		if in.ID != id {
			continue
		}
		image, format = in.Image, ""
		for _, im := range sec.Images {
			if im.SHA256 == in.Image {
				format = im.Format
			}
		}
		if r := in.RestoreFrom; r != nil {
			if !hex64(r.SHA256) {
				return nil, false, refuse("instance %s: restore_from names no snapshot", id)
			}
			image, format = "", "qcow2"
			base = qcow2.Backing{Path: snapshotDisk(h, r.SHA256), Format: "qcow2"}
		} else if !baseFormat(format) || !hex64(in.Image) {
			return nil, false, refuse("instance %s: its image %q is not one of the section's images", id, in.Image)
		} else if format != "iso" {
			base = qcow2.Backing{Path: h.DataDir + "/images/" + image + "." + format, Format: format}
		}
		mm := vmruntime.InstanceMachine(in.ID, in.VCPUs, in.MemoryMiB, in.Image, format, in.GPUs)
		mm.Taps = vmruntime.InstanceTaps(in.ID, in.NICs)
		m = &mm
	}
	if m == nil {
		return nil, false, refuse("the signed instances section names no instance %s", id)
	}
	host := domainxml.Host{InstancesDir: h.DataDir + "/instances", ImagesDir: h.DataDir + "/images", AllowTCG: h.Accel == domainxml.TCG}
	if err := guardedTaps(ctx, h, m.Taps, &host); err != nil {
		return nil, false, err
	}
	if len(m.GPUs) > 0 {
		gpus, err := h.GPUs(ctx)
		if err != nil {
			return nil, false, fmt.Errorf("listing this host's GPUs: %w", err)
		}
		host.GPU = func(uuid string) (domainxml.PCI, bool) {
			for g, bus := range gpus {
				if strings.EqualFold(g, uuid) {
					return parseBusID(bus)
				}
			}
			return domainxml.PCI{}, false
		}
	}
	if h.Node == "" {
		return nil, false, refuse("instance %s: root is bound to no node (no join record): its domain would name no owner", id)
	}
	req := m.Request(h.Accel)
	req.Node = h.Node
	if err := req.Check(host); err != nil {
		return nil, false, refuse("instance %s: %v", id, err)
	}
	if err := checkDisks(host, h.Owner, *m, base); err != nil {
		return nil, false, err
	}
	found, err = owned(ctx, h, id)
	if err != nil {
		return nil, false, err
	}
	if found {
		out, err := h.Virsh(ctx, nil, "domuuid", id)
		if err != nil {
			return nil, false, err
		}
		req.UUID = strings.TrimSpace(string(out))
	}
	xml, err = domainxml.Render(req, host)
	if err != nil {
		return nil, found, refuse("instance %s: %v", id, err)
	}
	return xml, found, nil
}

// guardedTaps refuses a tap the loaded network policy does not guard
// (a domain never gets an unguarded tap) and lets host.Bridges be the
// taps' bridges that are bridges of this host, as root reads them.
func guardedTaps(ctx context.Context, h helper.LibvirtHost, taps []vmruntime.Tap, host *domainxml.Host) error {
	if len(taps) == 0 {
		return nil
	}
	var names []string
	for _, t := range taps {
		if h.Guarded == nil {
			return refuse("tap %s: this helper loads no network policy", t.Name)
		}
		if err := h.Guarded(ctx, t.Name); err != nil {
			return refuse("%v", err)
		}
		names = append(names, t.Bridge)
	}
	hb, err := netpolicy.ReadHost("/sys", names)
	if err != nil {
		return err
	}
	for b := range hb.Bridges {
		host.Bridges = append(host.Bridges, b)
	}
	return nil
}

// Act runs libvirt.start, shutdown, destroy, suspend, resume, undefine
// or save on a domain bcd's metadata names. Destroying or undefining a
// domain that is not there, or destroying one that is not running, is
// success; start checks the instance's disks again first and resumes a
// domain libvirt.save stopped from root's saved state.
func (Ops) Act(ctx context.Context, h helper.LibvirtHost, op, id string) (bool, error) {
	return result(act(ctx, h, op, id))
}

func act(ctx context.Context, h helper.LibvirtHost, op, id string) error {
	found, err := owned(ctx, h, id)
	if err != nil {
		return err
	}
	if !found {
		if op == wire.OpLibvirtDestroy || op == wire.OpLibvirtUndefine {
			return nil
		}
		return refuse("%s: %v: %s", op, vmruntime.ErrNotFound, id)
	}
	verb := strings.TrimPrefix(op, "libvirt.")
	switch op {
	case wire.OpLibvirtStart:
		host := domainxml.Host{InstancesDir: h.DataDir + "/instances", ImagesDir: h.DataDir + "/images"}
		if err := checkStart(host, h.Owner, id); err != nil {
			return err
		}
		if err := startTaps(ctx, h, id); err != nil {
			return err
		}
		if resumed, err := resumeSaved(ctx, h, id); resumed || err != nil {
			return err
		}
	case wire.OpLibvirtSave:
		return save(ctx, h, id)
	case wire.OpLibvirtAttachDisk:
		return attachIdentity(ctx, h, id)
	case wire.OpLibvirtDestroy:
		dropSaved(h, id)
		out, err := h.Virsh(ctx, nil, "domstate", id)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) == "shut off" {
			return nil
		}
	case wire.OpLibvirtUndefine:
		dropSaved(h, id)
	case wire.OpLibvirtShutdown, wire.OpLibvirtSuspend, wire.OpLibvirtResume:
	default:
		return refuse("%s is not a libvirt operation", op)
	}
	_, err = h.Virsh(ctx, nil, verb, id)
	return err
}

// startTaps refuses to start a domain with an interface the loaded
// network policy does not guard (the tables flushed since it was
// defined, or an interface bcd did not name): virsh domiflist lists each
// interface's name first.
func startTaps(ctx context.Context, h helper.LibvirtHost, id string) error {
	out, err := h.Virsh(ctx, nil, "domiflist", id)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] == "Interface" || strings.HasPrefix(f[0], "---") {
			continue
		}
		if h.Guarded == nil {
			return refuse("start %s: interface %s: this helper loads no network policy", id, f[0])
		}
		if err := h.Guarded(ctx, f[0]); err != nil {
			return refuse("start %s: %v", id, err)
		}
	}
	return nil
}

// owned reports whether a domain is named id and bcd's metadata names
// it for the node root is bound to (or for no node: a domain rendered
// before the metadata named one, when a libvirtd served one node); a
// domain of that name bcd did not create, or made for another node, is
// refused.
func owned(ctx context.Context, h helper.LibvirtHost, id string) (bool, error) {
	out, err := h.Virsh(ctx, nil, "metadata", id, "--uri", domainxml.Namespace)
	md := strings.TrimSpace(string(out))
	switch {
	case err == nil && (md == `<instance id="`+id+`"/>` || h.Node != "" && md == `<instance id="`+id+`" node="`+h.Node+`"/>`):
		return true, nil
	case err == nil && strings.HasPrefix(md, `<instance id="`+id+`" node="`):
		return false, refuse("%v: %s is another node's domain and is never touched", vmruntime.ErrForeign, id)
	case err == nil || strings.Contains(err.Error(), "metadata not found"):
		return false, refuse("%v: %s is never touched", vmruntime.ErrForeign, id)
	case strings.Contains(err.Error(), "failed to get domain"):
		return false, nil
	}
	return false, err
}

// checkDisks checks each disk of m as root: a file of the instance's
// directory (or an iso base image in the images directory) that is a
// regular file of the node's uid with one link, reached without a
// symlink; the qcow2 disk an overlay of exactly its base image (qcow2 or
// raw, checked too: a qcow2 base names no backing file), or of nothing
// beside an iso; no data file and no encryption anywhere.
func checkDisks(host domainxml.Host, owner uint32, m vmruntime.Machine, backing qcow2.Backing) error {
	if backing.Path != "" {
		var want *qcow2.Backing
		if backing.Format == "qcow2" {
			want = &qcow2.Backing{}
		}
		if _, err := checkFile(backing.Path, owner, want); err != nil {
			return err
		}
	}
	for _, d := range m.Disks {
		path := host.DiskPath(m.ID, d.Name)
		if d.Base {
			path = host.ImagesDir + "/" + d.Name
		}
		var want *qcow2.Backing
		if d.Format == "qcow2" {
			want = &backing
		}
		if _, err := checkFile(path, owner, want); err != nil {
			return err
		}
	}
	return nil
}

// checkStart checks an instance's disk and seed again before its domain
// starts (QEMU opens them then): the disk an overlay of a base image in
// the images directory, or of nothing, each file as checkDisks does.
func checkStart(host domainxml.Host, owner uint32, id string) error {
	h, err := checkFile(host.DiskPath(id, vmruntime.DiskFile), owner, nil)
	if err != nil {
		return err
	}
	want := qcow2.Backing{}
	if h.Backing != "" {
		name, ok := strings.CutPrefix(h.Backing, host.ImagesDir+"/")
		digest, ext, _ := strings.Cut(name, ".")
		snap, isSnap := strings.CutPrefix(h.Backing, filepath.Dir(host.ImagesDir)+"/snapshots/")
		if isSnap && strings.HasSuffix(snap, ".d/disk.qcow2") && hex64(strings.TrimSuffix(snap, ".d/disk.qcow2")) && h.BackingFormat == "qcow2" {
			ok, digest, ext = true, strings.TrimSuffix(snap, ".d/disk.qcow2"), "qcow2"
		}
		if !ok || !hex64(digest) || ext != h.BackingFormat || (ext != "qcow2" && ext != "raw") {
			return refuse("disk of %s names backing file %q, not a base image of %s or a snapshot's disk", id, h.Backing, host.ImagesDir)
		}
		want = qcow2.Backing{Path: h.Backing, Format: ext}
		var base *qcow2.Backing
		if ext == "qcow2" {
			base = &qcow2.Backing{}
		}
		if _, err := checkFile(h.Backing, owner, base); err != nil {
			return err
		}
	}
	if _, err := checkFile(host.DiskPath(id, vmruntime.DiskFile), owner, &want); err != nil {
		return err
	}
	_, err = checkFile(host.DiskPath(id, vmruntime.SeedFile), owner, nil)
	return err
}

// checkFile opens path with no symlink anywhere on the way and checks it
// is a regular file of owner with one link; with want, its qcow2 header
// passes qcow2.Check against want (nil and no want: any qcow2 header,
// whose backing the caller then checks; nil want on a non-qcow2 format
// is never probed: see checkDisks). A refusal names the path.
func checkFile(path string, owner uint32, want *qcow2.Backing) (qcow2.Header, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return qcow2.Header{}, refuse("disk %s: a symlink is on its way", path)
		}
		return qcow2.Header{}, refuse("disk %s: %v", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return qcow2.Header{}, err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return qcow2.Header{}, refuse("disk %s is not a regular file", path)
	case st.Uid != owner:
		return qcow2.Header{}, refuse("disk %s belongs to uid %d, not the node's %d", path, st.Uid, owner)
	case st.Nlink != 1:
		return qcow2.Header{}, refuse("disk %s has %d links; a disk has one", path, st.Nlink)
	}
	if want == nil && !strings.HasSuffix(path, ".qcow2") {
		return qcow2.Header{}, nil
	}
	b := make([]byte, qcow2.ReadBytes)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return qcow2.Header{}, fmt.Errorf("disk %s: %w", path, err)
	}
	var h qcow2.Header
	if want == nil {
		h, err = qcow2.Parse(b[:n])
	} else {
		h, err = qcow2.Check(b[:n], *want)
	}
	if err != nil {
		return h, refuse("disk %s refused: %v", path, err)
	}
	return h, nil
}

// snapshotDisk is the disk of the snapshot digest, as the node unpacks
// it: the base of a restored instance's overlay.
func snapshotDisk(h helper.LibvirtHost, digest string) string {
	return h.DataDir + "/snapshots/" + digest + ".d/disk.qcow2"
}

func baseFormat(f string) bool { return f == "qcow2" || f == "raw" || f == "iso" }

func hex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseBusID reads nvidia-smi's pci.bus_id, DDDDDDDD:BB:SS.F (or
// DDDD:BB:SS.F), all hex.
func parseBusID(s string) (domainxml.PCI, bool) {
	dom, rest, ok1 := strings.Cut(strings.TrimSpace(s), ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	slot, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 || len(dom) > 8 || len(bus) != 2 || len(slot) != 2 || len(fn) != 1 {
		return domainxml.PCI{}, false
	}
	d, e1 := strconv.ParseUint(dom, 16, 32)
	b, e2 := strconv.ParseUint(bus, 16, 8)
	sl, e3 := strconv.ParseUint(slot, 16, 8)
	f, e4 := strconv.ParseUint(fn, 16, 8)
	if e1 != nil || e2 != nil || e3 != nil || e4 != nil || d > 0xffff || sl > 0x1f || f > 7 {
		return domainxml.PCI{}, false
	}
	return domainxml.PCI{Domain: uint16(d), Bus: uint8(b), Slot: uint8(sl), Function: uint8(f)}, true
}
