// Package inventory describes a node's hardware and software as NodeInventory
// v1 and reads it from procfs and sysfs without cgo.
//
// An Inventory has sections (system, cpu, memory, disks, nics, gpus, os,
// cgroups, kvm, iommu). Each section encodes to canonical JSON and is hashed,
// so the control plane can tell which sections changed from the hashes alone;
// the overall hash covers the section hashes. What changes from one reading
// to the next (GPU temperature, power draw, clocks, utilization, memory used,
// processes) lives in Live, which no hash covers.
//
// Collect reads the real machine; it calls collect with "/" as the root, and
// the tests call collect on fake trees. Pieces that cannot be read are left
// empty and noted in Notes; they never fail the collection.
package inventory

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sort"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// Schema names this version of the inventory.
const Schema = "bcd.inventory/v1"

// The section names, as they appear in Sections and Hashes.
const (
	SectionSystem  = "system"
	SectionCPU     = "cpu"
	SectionMemory  = "memory"
	SectionDisks   = "disks"
	SectionNICs    = "nics"
	SectionGPUs    = "gpus"
	SectionOS      = "os"
	SectionCgroups = "cgroups"
	SectionKVM     = "kvm"
	SectionIOMMU   = "iommu"
)

// Inventory is NodeInventory v1.
type Inventory struct {
	Schema  string  `json:"schema"`
	System  System  `json:"system"`
	CPU     CPU     `json:"cpu"`
	Memory  Memory  `json:"memory"`
	Disks   []Disk  `json:"disks"`
	NICs    []NIC   `json:"nics"`
	GPUs    []GPU   `json:"gpus"`
	OS      OS      `json:"os"`
	Cgroups Cgroups `json:"cgroups"`
	KVM     KVM     `json:"kvm"`
	IOMMU   IOMMU   `json:"iommu"`

	// SectionHashes and Hash are set by Seal.
	SectionHashes map[string]string `json:"section_hashes,omitempty"`
	Hash          string            `json:"hash,omitempty"`

	// Live holds samples that are not part of any hash.
	Live Live `json:"live"`
	// Notes says what could not be read.
	Notes []string `json:"notes,omitempty"`
}

// System is the machine itself, from DMI and firmware.
type System struct {
	Vendor      string `json:"vendor"`
	Product     string `json:"product"`
	Serial      string `json:"serial"` // root-only: empty when unreadable
	ProductUUID string `json:"product_uuid"`
	BoardVendor string `json:"board_vendor"`
	BoardName   string `json:"board_name"`
	BIOSVendor  string `json:"bios_vendor"`
	BIOSVersion string `json:"bios_version"`
	BIOSDate    string `json:"bios_date"`
	UEFI        bool   `json:"uefi"`
	// SecureBoot is "enabled", "disabled", or "" when it cannot be read.
	SecureBoot string `json:"secure_boot"`
	TPM        bool   `json:"tpm"`
	TPMVersion string `json:"tpm_version,omitempty"`
}

// CPU is the processors and their NUMA layout.
type CPU struct {
	Vendor  string `json:"vendor"`
	Model   string `json:"model"`
	Sockets int    `json:"sockets"`
	Cores   int    `json:"cores"`
	Threads int    `json:"threads"`
	// Flags is the subset of CPU flags that placement cares about
	// (virtualization, AVX-512, AMX, memory encryption, …), sorted.
	Flags []string   `json:"flags"`
	NUMA  []NUMANode `json:"numa"`
}

// NUMANode is one NUMA node: its CPUs as a kernel CPU list and its memory.
type NUMANode struct {
	ID          int    `json:"id"`
	CPUs        string `json:"cpus"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

// Memory is the system memory and its huge page pools.
type Memory struct {
	TotalBytes  uint64 `json:"total_bytes"`
	HugePages2M int64  `json:"hugepages_2m"`
	HugePages1G int64  `json:"hugepages_1g"`
}

// Disk is one block device (loop, ram, zram, dm and md devices are left
// out: they are made by software, not hardware).
type Disk struct {
	Name       string `json:"name"`
	SizeBytes  uint64 `json:"size_bytes"`
	Rotational bool   `json:"rotational"`
	Removable  bool   `json:"removable"`
	Model      string `json:"model"`
	Serial     string `json:"serial"`
	Transport  string `json:"transport"` // nvme, sata, sas, scsi, virtio, usb, mmc
}

// NIC is one physical network interface. Virtual interfaces (no device:
// bridges, veths, tunnels) and SR-IOV virtual functions are left out, since
// they come and go with the workloads.
type NIC struct {
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	Driver     string `json:"driver"`
	PCIAddress string `json:"pci_address,omitempty"`
	PCIVendor  string `json:"pci_vendor,omitempty"` // 0x15b3
	PCIDevice  string `json:"pci_device,omitempty"` // 0x1021
	// SpeedMbps is the link speed; 0 when the link is down or unknown.
	SpeedMbps     int      `json:"speed_mbps"`
	SRIOVTotalVFs int      `json:"sriov_totalvfs"`
	RDMA          bool     `json:"rdma"`
	RDMADevices   []string `json:"rdma_devices,omitempty"`
}

// GPU is one NVIDIA GPU: what /proc/driver/nvidia says, completed by
// nvidia-smi (SMI) when it ran.
type GPU struct {
	UUID     string      `json:"uuid"`
	PCIBusID string      `json:"pci_bus_id"`
	Model    string      `json:"model"`
	VBIOS    string      `json:"vbios,omitempty"`
	Minor    *int        `json:"minor,omitempty"`
	SMI      *nvsmi.Info `json:"smi,omitempty"`
}

// OS is the running operating system.
type OS struct {
	ID         string `json:"id"`
	VersionID  string `json:"version_id"`
	PrettyName string `json:"pretty_name"`
	Kernel     string `json:"kernel"`
	Arch       string `json:"arch"`
	BootID     string `json:"boot_id"`
}

// Cgroups is the cgroup hierarchy: "v2", "v1", "hybrid", or "".
type Cgroups struct {
	Version     string   `json:"version"`
	Controllers []string `json:"controllers"`
}

// KVM says whether /dev/kvm exists.
type KVM struct {
	Present bool `json:"present"`
}

// IOMMU counts IOMMU units and groups.
type IOMMU struct {
	Units  int `json:"units"`
	Groups int `json:"groups"`
}

// Live is what changes from one reading to the next; it is not hashed.
type Live struct {
	GPUs []GPUSample `json:"gpus,omitempty"`
}

// GPUSample is one GPU's sample, keyed like the GPU section, with the
// health checks' findings when the caller judged the GPUs (SetFindings).
type GPUSample struct {
	UUID     string          `json:"uuid"`
	PCIBusID string          `json:"pci_bus_id"`
	Sample   nvsmi.Sample    `json:"sample"`
	Findings []nvsmi.Finding `json:"findings,omitempty"`
}

// SMIGPUs returns the GPUs nvidia-smi completed, as nvsmi records: their
// Info and their sample from Live, in the inventory's order.
func (inv *Inventory) SMIGPUs() []nvsmi.GPU {
	var out []nvsmi.GPU
	for _, g := range inv.GPUs {
		if g.SMI == nil {
			continue
		}
		r := nvsmi.GPU{Info: *g.SMI}
		for _, s := range inv.Live.GPUs {
			if s.UUID == g.UUID && s.PCIBusID == g.PCIBusID {
				r.Sample = s.Sample
			}
		}
		out = append(out, r)
	}
	return out
}

// SetFindings puts each finding on the Live sample of its GPU (named by
// UUID, or by PCI address when it has none).
func (inv *Inventory) SetFindings(fs []nvsmi.Finding) {
	for i := range inv.Live.GPUs {
		s := &inv.Live.GPUs[i]
		s.Findings = nil
		for _, f := range fs {
			if (s.UUID != "" && f.GPU == s.UUID) || (s.UUID == "" && nvsmi.NormalizeBusID(f.GPU) == nvsmi.NormalizeBusID(s.PCIBusID)) {
				s.Findings = append(s.Findings, f)
			}
		}
	}
}

// MergeSMI completes the GPUs with nvidia-smi's records, matched by UUID
// and, for GPUs whose UUID /proc did not show, by PCI address; GPUs only
// nvidia-smi knows are added. Their samples replace those in Live.
func (inv *Inventory) MergeSMI(gpus []nvsmi.GPU) {
	for _, s := range gpus {
		bus := nvsmi.NormalizeBusID(s.PCIBusID)
		var g *GPU
		for i := range inv.GPUs {
			if s.UUID != "" && inv.GPUs[i].UUID == s.UUID {
				g = &inv.GPUs[i]
				break
			}
		}
		if g == nil {
			for i := range inv.GPUs {
				if bus != "" && nvsmi.NormalizeBusID(inv.GPUs[i].PCIBusID) == bus {
					g = &inv.GPUs[i]
					break
				}
			}
		}
		if g == nil {
			inv.GPUs = append(inv.GPUs, GPU{})
			g = &inv.GPUs[len(inv.GPUs)-1]
		}
		if g.UUID == "" {
			g.UUID = s.UUID
		}
		if g.PCIBusID == "" {
			g.PCIBusID = bus
		}
		if g.Model == "" {
			g.Model = s.Name
		}
		if g.VBIOS == "" {
			g.VBIOS = s.VBIOS
		}
		info := s.Info
		g.SMI = &info

		sample := GPUSample{UUID: g.UUID, PCIBusID: g.PCIBusID, Sample: s.Sample}
		replaced := false
		for i := range inv.Live.GPUs {
			if inv.Live.GPUs[i].UUID == sample.UUID && inv.Live.GPUs[i].PCIBusID == sample.PCIBusID {
				inv.Live.GPUs[i] = sample
				replaced = true
			}
		}
		if !replaced {
			inv.Live.GPUs = append(inv.Live.GPUs, sample)
		}
	}
	sort.SliceStable(inv.Live.GPUs, func(i, j int) bool {
		return gpuLess(inv.Live.GPUs[i].UUID, inv.Live.GPUs[i].PCIBusID, inv.Live.GPUs[j].UUID, inv.Live.GPUs[j].PCIBusID)
	})
}

func gpuLess(u1, b1, u2, b2 string) bool {
	if u1 != u2 {
		return u1 < u2
	}
	return b1 < b2
}

// sections returns each section's value, normalized: slices sorted by
// their stable keys, on a deep copy so inv is left as it is.
func (inv *Inventory) sections() (map[string]any, error) {
	b, err := json.Marshal(inv)
	if err != nil {
		return nil, err
	}
	var c Inventory
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	c.normalize()
	// A list section with nothing in it encodes as [] whether it is nil
	// or empty.
	if c.Disks == nil {
		c.Disks = []Disk{}
	}
	if c.NICs == nil {
		c.NICs = []NIC{}
	}
	if c.GPUs == nil {
		c.GPUs = []GPU{}
	}
	return map[string]any{
		SectionSystem:  c.System,
		SectionCPU:     c.CPU,
		SectionMemory:  c.Memory,
		SectionDisks:   c.Disks,
		SectionNICs:    c.NICs,
		SectionGPUs:    c.GPUs,
		SectionOS:      c.OS,
		SectionCgroups: c.Cgroups,
		SectionKVM:     c.KVM,
		SectionIOMMU:   c.IOMMU,
	}, nil
}

// normalize sorts every slice by its stable key.
func (inv *Inventory) normalize() {
	sort.Strings(inv.CPU.Flags)
	sort.Slice(inv.CPU.NUMA, func(i, j int) bool { return inv.CPU.NUMA[i].ID < inv.CPU.NUMA[j].ID })
	sort.Slice(inv.Disks, func(i, j int) bool { return inv.Disks[i].Name < inv.Disks[j].Name })
	sort.Slice(inv.NICs, func(i, j int) bool { return inv.NICs[i].Name < inv.NICs[j].Name })
	for i := range inv.NICs {
		sort.Strings(inv.NICs[i].RDMADevices)
	}
	sort.Slice(inv.GPUs, func(i, j int) bool {
		a, b := inv.GPUs[i], inv.GPUs[j]
		return gpuLess(a.UUID, a.PCIBusID, b.UUID, b.PCIBusID)
	})
	for i := range inv.GPUs {
		if s := inv.GPUs[i].SMI; s != nil {
			sort.Slice(s.NVLinks, func(a, b int) bool { return s.NVLinks[a].Link < s.NVLinks[b].Link })
			sort.Slice(s.Topology, func(a, b int) bool { return s.Topology[a].Peer < s.Topology[b].Peer })
			sort.Slice(s.MIG.Devices, func(a, b int) bool { return s.MIG.Devices[a].Index < s.MIG.Devices[b].Index })
			sort.Slice(s.MIG.Profiles, func(a, b int) bool {
				pa, pb := s.MIG.Profiles[a], s.MIG.Profiles[b]
				if pa.GPU != pb.GPU {
					return pa.GPU < pb.GPU
				}
				return pa.ID < pb.ID
			})
		}
	}
	sort.Strings(inv.Cgroups.Controllers)
}

// Sections returns each section's canonical JSON by name.
func (inv *Inventory) Sections() map[string][]byte {
	secs, err := inv.sections()
	out := make(map[string][]byte, len(secs))
	if err != nil {
		// The types hold only strings, numbers and bools that encode;
		// this cannot happen, but a section must never hash as valid.
		return out
	}
	for name, v := range secs {
		b, err := Canonical(v)
		if err != nil {
			continue
		}
		out[name] = b
	}
	return out
}

// Hashes returns each section's hash, "sha256:" and the hex SHA-256 of its
// canonical JSON.
func (inv *Inventory) Hashes() map[string]string {
	out := map[string]string{}
	for name, b := range inv.Sections() {
		out[name] = HashBytes(b)
	}
	return out
}

// Seal sets SectionHashes, Hash (the hash of the canonical JSON of the
// section hashes) and Schema.
func (inv *Inventory) Seal() {
	inv.Schema = Schema
	inv.SectionHashes = inv.Hashes()
	inv.Hash = OverallHash(inv.SectionHashes)
}

// OverallHash is the hash over section hashes: "sha256:" and the hex
// SHA-256 of the canonical JSON object mapping section names to hashes.
func OverallHash(sections map[string]string) string {
	b, err := Canonical(sections)
	if err != nil {
		return ""
	}
	return HashBytes(b)
}

// HashBytes returns "sha256:" and the hex SHA-256 of b.
func HashBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
