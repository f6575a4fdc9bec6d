// Package vmruntime is what every VM runtime implements (libvirt-kvm
// through bcd helper, the file-backed runtime of fakehw builds) and the
// instances converger drives: List every domain of the host, Ensure one
// instance's definition, SetState to RUNNING, PAUSED or STOPPED, and
// Destroy. A runtime acts only on domains bcd created (their record or
// metadata names the instance); a domain it did not create is listed,
// never touched. runtimetest is the one suite every runtime passes.
// docs/instances.md describes the runtimes.
package vmruntime

import (
	"context"
	"errors"
	"slices"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/vm/domainxml"
)

// The states of a domain.
const (
	Running = "RUNNING"
	Paused  = "PAUSED"
	Stopped = "STOPPED"
)

// Errors every runtime returns for the same cases (wrapped, with its
// own words).
var (
	// ErrForeign: a domain bcd did not create has the instance's id.
	ErrForeign = errors.New("a domain bcd did not create has this name")
	// ErrNotFound: no domain has the id.
	ErrNotFound = errors.New("no such domain")
)

// Disk and Tap are the domain renderer's: a file in the instance's
// directory, a NIC by tap name.
type (
	Disk = domainxml.Disk
	Tap  = domainxml.Tap
)

// Machine is one instance's definition.
type Machine struct {
	ID        string   `json:"id"`
	VCPUs     int      `json:"vcpus"`
	MemoryMiB int      `json:"memory_mib"`
	Disks     []Disk   `json:"disks"`
	Taps      []Tap    `json:"taps,omitempty"`
	GPUs      []string `json:"gpus,omitempty"`
}

// Equal reports whether m and o define the same machine.
func (m Machine) Equal(o Machine) bool {
	return m.ID == o.ID && m.VCPUs == o.VCPUs && m.MemoryMiB == o.MemoryMiB &&
		slices.Equal(m.Disks, o.Disks) && slices.Equal(m.Taps, o.Taps) && slices.Equal(m.GPUs, o.GPUs)
}

// Request is m as the domain renderer takes it, at accel.
func (m Machine) Request(accel string) domainxml.Request {
	return domainxml.Request{ID: m.ID, VCPUs: m.VCPUs, MemoryMiB: m.MemoryMiB, Accel: accel, Disks: m.Disks, Taps: m.Taps, GPUs: m.GPUs}
}

// Domain is what List reports of one domain.
type Domain struct {
	ID    string
	State string
	// Owned: bcd created it (its metadata names the instance). Machine is
	// its definition, for owned domains only.
	Owned   bool
	Machine Machine
}

// Runtime runs instances.
type Runtime interface {
	// Name is the runtime's kind, as Hello.drivers lists it.
	Name() string
	// List reports every domain of the host, bcd's and others', by id.
	List(ctx context.Context) ([]Domain, error)
	// Ensure defines m (STOPPED when new) or redefines it when it
	// differs, and reports whether it changed anything; a running
	// domain takes a new definition at its next start. ErrForeign when
	// a domain bcd did not create has m's id.
	Ensure(ctx context.Context, m Machine) (changed bool, err error)
	// SetState starts, pauses, resumes or powers off an owned domain
	// (STOPPED to PAUSED starts it paused). ErrNotFound, ErrForeign.
	SetState(ctx context.Context, id, state string) error
	// Destroy powers off and removes an owned domain; one that is not
	// there is success. ErrForeign. Disks are the caller's.
	Destroy(ctx context.Context, id string) error
}

// Files of an instance, in data_dir/instances/<id>/.
const (
	DiskFile = "disk.qcow2"
	SeedFile = "seed.iso"
)

// InstanceMachine is the domain of an instance: its disk (after an iso
// base image's cdrom, when it boots from one) and its seed. The node's
// converger and bcd helper, which takes the instance from the signed
// section itself, both build a domain with it, so the two agree.
func InstanceMachine(id string, vcpus, memoryMiB int, image, imageFormat string, gpus []string) Machine {
	disks := []Disk{{Name: DiskFile, Format: "qcow2", Boot: 1}}
	if imageFormat == "iso" {
		disks = []Disk{{Name: image + ".iso", Format: "raw", CDROM: true, Base: true, Boot: 1}, {Name: DiskFile, Format: "qcow2", Boot: 2}}
	}
	disks = append(disks, Disk{Name: SeedFile, Format: "raw", CDROM: true})
	return Machine{ID: id, VCPUs: vcpus, MemoryMiB: memoryMiB, Disks: disks, GPUs: gpus}
}

// InstanceTaps are an instance's NICs as the domain's taps: each named
// by netpolicy.TapName from the instance id and the NIC's index, with the
// NIC's bridge and MAC. The network policy binds the same names.
func InstanceTaps(id string, nics []netpolicy.NIC) []Tap {
	var taps []Tap
	for i, n := range nics {
		taps = append(taps, Tap{Name: netpolicy.TapName(id, i), Bridge: n.Bridge, MAC: n.MAC})
	}
	return taps
}

// ValidState reports whether s is RUNNING, PAUSED or STOPPED.
func ValidState(s string) bool { return s == Running || s == Paused || s == Stopped }

// MemoryRestorer is what a runtime that resumes memory snapshots offers
// (libvirt-kvm through bcd helper's libvirt.restore): the defined,
// stopped domain of m resumes from the saved memory the instance's
// directory holds as MemoryFile.
type MemoryRestorer interface {
	RestoreMemory(ctx context.Context, m Machine) error
}

// MemoryFile is an instance's saved memory in its directory: what
// libvirt.save hands to the node, and what libvirt.restore resumes.
const MemoryFile = "memory.save"
