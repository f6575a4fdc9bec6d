// Package spec is the node's instances section of the NodeSpec: the whole
// set of virtual machines the host should run, and the base images they
// boot from. Decode reads it strictly and checks every value, touching
// nothing; the converger that acts on it, and the runtimes it drives, are
// the other packages of components/vm. docs/instances.md describes the
// section.
package spec

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/base/filehash"
	"github.com/better-compute/bcd/components/base/httpsurl"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// The states an instance may be asked for, and reported in.
const (
	Running = vmruntime.Running
	Paused  = vmruntime.Paused
	Stopped = vmruntime.Stopped
)

// The formats of a base image. A qcow2 image's header is read in Go
// (components/vm/qcow2) before use; raw and iso images are never probed.
const (
	QCOW2 = "qcow2"
	Raw   = "raw"
	ISO   = "iso"
)

// Bounds of an instance.
const (
	MaxInstances = 256
	MaxImages    = 64
	MaxVCPUs     = domainxml.MaxVCPUs
	MinMemoryMiB = domainxml.MinMemoryMiB
	MaxMemoryMiB = domainxml.MaxMemoryMiB
	MaxDiskGiB   = 64 << 10 // 64 TiB
	MaxGPUs      = domainxml.MaxGPUs
	MaxURL       = 2048
)

// Body is the instances section.
type Body struct {
	Images    []Image    `json:"images"`
	Instances []Instance `json:"instances"`
}

// Image is a base image: named by its SHA-256, fetched over https from
// URL only, verified before use, kept under data_dir while an instance
// names it.
type Image struct {
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
	Format string `json:"format"`
	// SPKIPin ("sha256/<base64>") pins the image server: one certificate
	// of the chain it presents must have that key, and the leaf must
	// chain to it. Empty: the system's roots.
	SPKIPin string `json:"spki_pin,omitempty"`
}

// Instance is one virtual machine.
type Instance struct {
	// ID names the instance: its domain, its directory under data_dir.
	ID string `json:"id"`
	// Allocation is the booking it belongs to: its user data is fetched
	// with a SecretRequest bound to it, and its GPUs are held for it.
	Allocation string `json:"allocation"`
	// State is RUNNING, PAUSED or STOPPED.
	State     string `json:"state"`
	VCPUs     int    `json:"vcpus"`
	MemoryMiB int    `json:"memory_mib"`
	// Image is the SHA-256 of an entry of Images: a qcow2 or raw image is
	// the base of the instance's qcow2 overlay; an iso image is attached
	// as a cdrom beside an empty disk of DiskGiB.
	Image string `json:"image"`
	// DiskGiB is the instance disk's virtual size; 0: the base image's.
	DiskGiB int `json:"disk_gib,omitempty"`
	// UserData: the allocation's user data goes into the NoCloud seed.
	UserData bool `json:"user_data,omitempty"`
	// Hostname is the seed's local-hostname; empty: the instance id.
	Hostname string `json:"hostname,omitempty"`
	// GPUs are passed through whole, by UUID (GPU-...).
	GPUs []string `json:"gpus,omitempty"`
	// NICs are its network interfaces, each a tap (named by
	// netpolicy.TapName from the id and the NIC's index) on a host
	// bridge, guarded and policed by bcd helper's nftables tables.
	NICs []netpolicy.NIC `json:"nics,omitempty"`
	// RestoreFrom boots the instance from a snapshot (instance.snapshot's
	// archive) instead of a base image: Image is then empty.
	RestoreFrom *Restore `json:"restore_from,omitempty"`
}

// Restore is a snapshot an instance starts from: fetched over https
// only, verified by its SHA-256, its disk the base of the instance's
// overlay; with Memory, the guest resumes from its saved memory (only
// into the same vCPUs, memory and CPU model).
type Restore struct {
	URL    string `json:"url"`
	SHA256 string `json:"sha256"`
	Memory bool   `json:"memory,omitempty"`
	// SPKIPin pins the snapshot's server, as an image's.
	SPKIPin string `json:"spki_pin,omitempty"`
}

// Source is the image entry a restore is fetched as: its archive, never
// probed before its digest matches.
func (r Restore) Source() Image {
	return Image{SHA256: r.SHA256, URL: r.URL, Format: Raw, SPKIPin: r.SPKIPin}
}

// Decode reads the section strictly (no unknown field, one JSON value)
// and checks every value. A nil body is an empty section: no instance.
func Decode(body json.RawMessage) (Body, error) {
	var b Body
	if err := converge.DecodeSection(body, &b); err != nil {
		return b, err
	}
	if len(b.Images) > MaxImages {
		return b, fmt.Errorf("%d images; at most %d", len(b.Images), MaxImages)
	}
	if len(b.Instances) > MaxInstances {
		return b, fmt.Errorf("%d instances; at most %d", len(b.Instances), MaxInstances)
	}
	images := map[string]Image{}
	for i, im := range b.Images {
		if err := checkImage(im); err != nil {
			return b, fmt.Errorf("images[%d]: %w", i, err)
		}
		if _, dup := images[im.SHA256]; dup {
			return b, fmt.Errorf("images[%d]: sha256 %s named twice", i, im.SHA256)
		}
		images[im.SHA256] = im
	}
	ids := map[string]bool{}
	gpus := map[string]string{}
	claims := map[string]string{} // a NIC's MAC or address -> its instance
	for i, in := range b.Instances {
		if err := checkInstance(in, images); err != nil {
			return b, fmt.Errorf("instances[%d]: %w", i, err)
		}
		if ids[in.ID] {
			return b, fmt.Errorf("instances[%d]: id %s named twice", i, in.ID)
		}
		ids[in.ID] = true
		for _, g := range in.GPUs {
			if other, ok := gpus[strings.ToLower(g)]; ok {
				return b, fmt.Errorf("instances[%d]: GPU %s is also instance %s's", i, g, other)
			}
			gpus[strings.ToLower(g)] = in.ID
		}
		for j, n := range in.NICs {
			keys := []string{"mac " + n.MAC}
			for _, a := range n.Addresses {
				p, _ := netpolicy.ParseAddress(a)
				keys = append(keys, "address "+p.Addr().String())
			}
			for _, k := range keys {
				if other, ok := claims[k]; ok {
					return b, fmt.Errorf("instances[%d]: nics[%d]: %s is also instance %s's", i, j, k, other)
				}
				claims[k] = in.ID
			}
		}
	}
	return b, nil
}

func checkImage(im Image) error {
	if !filehash.ValidDigest(im.SHA256) {
		return fmt.Errorf("sha256 %q is not 64 lowercase hex digits", im.SHA256)
	}
	if len(im.URL) > MaxURL {
		return fmt.Errorf("url is %d bytes; at most %d", len(im.URL), MaxURL)
	}
	if err := httpsurl.Check(im.URL); err != nil {
		return fmt.Errorf("url %s: %w", httpsurl.Redact(im.URL), err)
	}
	switch im.Format {
	case QCOW2, Raw, ISO:
	default:
		return fmt.Errorf("format %q is not qcow2, raw or iso", im.Format)
	}
	if im.SPKIPin != "" {
		if _, err := pki.ParsePin(im.SPKIPin); err != nil {
			return fmt.Errorf("spki_pin: %w", err)
		}
	}
	return nil
}

func checkInstance(in Instance, images map[string]Image) error {
	switch {
	case !domainxml.ValidID(in.ID):
		return fmt.Errorf("id %q is not [A-Za-z0-9][A-Za-z0-9_-], 1 to 64", in.ID)
	case !cdispec.ValidAllocation(in.Allocation):
		return fmt.Errorf("allocation %q is not [A-Za-z0-9][A-Za-z0-9_-], 1 to 128", in.Allocation)
	case !vmruntime.ValidState(in.State):
		return fmt.Errorf("state %q is not RUNNING, PAUSED or STOPPED", in.State)
	case in.VCPUs < 1 || in.VCPUs > MaxVCPUs:
		return fmt.Errorf("vcpus %d: 1 to %d", in.VCPUs, MaxVCPUs)
	case in.MemoryMiB < MinMemoryMiB || in.MemoryMiB > MaxMemoryMiB:
		return fmt.Errorf("memory_mib %d: %d to %d", in.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	case in.DiskGiB < 0 || in.DiskGiB > MaxDiskGiB:
		return fmt.Errorf("disk_gib %d: 0 to %d", in.DiskGiB, MaxDiskGiB)
	case in.Hostname != "" && !validHostname(in.Hostname):
		return fmt.Errorf("hostname %q is not a DNS label ([a-z0-9-], 1 to 63, no leading or trailing -)", in.Hostname)
	case len(in.GPUs) > MaxGPUs:
		return fmt.Errorf("%d GPUs; at most %d", len(in.GPUs), MaxGPUs)
	case len(in.NICs) > netpolicy.MaxNICs:
		return fmt.Errorf("%d NICs; at most %d", len(in.NICs), netpolicy.MaxNICs)
	}
	for j, n := range in.NICs {
		if err := netpolicy.CheckNIC(n); err != nil {
			return fmt.Errorf("nics[%d]: %w", j, err)
		}
	}
	if r := in.RestoreFrom; r != nil {
		if in.Image != "" || in.DiskGiB != 0 {
			return fmt.Errorf("restore_from: the disk is the snapshot's; give no image and no disk_gib")
		}
		if err := checkImage(r.Source()); err != nil {
			return fmt.Errorf("restore_from: %w", err)
		}
		return checkGPUs(in.GPUs)
	}
	im, ok := images[in.Image]
	if !ok {
		return fmt.Errorf("image %q is not the sha256 of an entry of images", in.Image)
	}
	if im.Format == ISO && in.DiskGiB == 0 {
		return fmt.Errorf("image %s is an iso: disk_gib must size the empty disk beside it", in.Image)
	}
	return checkGPUs(in.GPUs)
}

func checkGPUs(gpus []string) error {
	seen := map[string]bool{}
	for _, g := range gpus {
		if !domainxml.ValidGPU(g) {
			return fmt.Errorf("GPU %q is not a GPU UUID (GPU-<hex and dashes>)", g)
		}
		if seen[strings.ToLower(g)] {
			return fmt.Errorf("GPU %s named twice", g)
		}
		seen[strings.ToLower(g)] = true
	}
	return nil
}

// validHostname is a DNS label: [a-z0-9-], 1 to 63, no leading or
// trailing dash.
func validHostname(h string) bool {
	return len(h) >= 1 && len(h) <= 63 && h[0] != '-' && h[len(h)-1] != '-' && !strings.ContainsFunc(h, func(r rune) bool {
		return !('0' <= r && r <= '9' || 'a' <= r && r <= 'z' || r == '-')
	})
}
