// Package fakehw is a deterministic fake machine: an HGX node with eight
// H100 SXM5 80GB GPUs, for fakehw builds, bcd sim and tests without
// hardware.
//
// Machine(seed) is the node's whole inventory; its serial numbers, UUIDs,
// MAC addresses, boot id and GPU samples are derived from the seed, so the
// same seed always gives the same bytes and hashes and different seeds give
// different machines. Each derived value is read from
// SHA-256("bcd-fakehw/v1/<seed>/<label>"), which another implementation (the
// FakeDaemon) can reproduce. NvidiaSMI(seed) answers like nvidia-smi on
// that machine, so nvsmi parses back the same GPUs.
package fakehw

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// The fake node's fixed facts.
const (
	GPUCount      = 8
	GPUName       = "NVIDIA H100 80GB HBM3"
	DriverVersion = "550.54.15"
	CUDAVersion   = "12.4"
	NVLinksPerGPU = 18
	NVLinkGBps    = 26.562
	gpuMemoryMiB  = 81559
	gpuVBIOS      = "96.00.74.00.0D"
	cpusSocket0   = "0-55,112-167"
	cpusSocket1   = "56-111,168-223"
	tib           = uint64(1) << 40
)

// gpuBuses are the PCI buses of the eight GPUs, and computeNICBuses those
// of the ConnectX-7 NIC next to each.
func gpuBuses() []int        { return []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb} }
func computeNICBuses() []int { return []int{0x19, 0x2b, 0x3b, 0x5e, 0x9b, 0xac, 0xbb, 0xdc} }

// derive returns the bytes a value labelled label is made from.
func derive(seed int64, label string) [32]byte {
	return sha256.Sum256([]byte(fmt.Sprintf("bcd-fakehw/v1/%d/%s", seed, label)))
}

// uuid makes a version 4 UUID.
func uuid(seed int64, label string) string {
	b := derive(seed, label)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:16])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// digits makes n decimal digits.
func digits(seed int64, label string, n int) string {
	b := derive(seed, label)
	var s strings.Builder
	for i := 0; i < n; i++ {
		s.WriteByte('0' + b[i%len(b)]%10)
	}
	return s.String()
}

// upperHex makes n upper-case hex digits.
func upperHex(seed int64, label string, n int) string {
	b := derive(seed, label)
	return strings.ToUpper(hex.EncodeToString(b[:]))[:n]
}

// intn makes a number in [0, n).
func intn(seed int64, label string, n int) int {
	b := derive(seed, label)
	return int(binary.BigEndian.Uint64(b[:8]) % uint64(n))
}

// mac makes a MAC address with the given three-byte prefix.
func mac(seed int64, label, oui string) string {
	b := derive(seed, label)
	return fmt.Sprintf("%s:%02x:%02x:%02x", oui, b[0], b[1], b[2])
}

// GPUUUID is the UUID of GPU i of the machine made from seed.
func GPUUUID(seed int64, i int) string {
	return "GPU-" + uuid(seed, fmt.Sprintf("gpu/%d/uuid", i))
}

func busID(bus, fn int) string { return fmt.Sprintf("0000:%02x:00.%d", bus, fn) }

func socketOf(gpu int) int { return gpu / 4 }

// Machine returns the sealed inventory of the node made from seed.
func Machine(seed int64) *inventory.Inventory {
	inv := &inventory.Inventory{
		System: inventory.System{
			Vendor:      "Supermicro",
			Product:     "SYS-821GE-TNHR",
			Serial:      "S" + digits(seed, "system/serial", 12),
			ProductUUID: uuid(seed, "system/uuid"),
			BoardVendor: "Supermicro",
			BoardName:   "X13DEG-OAD",
			BIOSVendor:  "American Megatrends International, LLC.",
			BIOSVersion: "2.1",
			BIOSDate:    "01/12/2024",
			UEFI:        true,
			SecureBoot:  "disabled",
			TPM:         true,
			TPMVersion:  "2",
		},
		CPU: inventory.CPU{
			Vendor:  "GenuineIntel",
			Model:   "Intel(R) Xeon(R) Platinum 8480+",
			Sockets: 2, Cores: 112, Threads: 224,
			Flags: []string{"aes", "amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16", "avx512_fp16",
				"avx512_vnni", "avx512bw", "avx512f", "avx512vl", "ept", "fma", "pdpe1gb", "rdrand", "rdseed", "sha_ni",
				"vmx", "x2apic"},
			NUMA: []inventory.NUMANode{
				{ID: 0, CPUs: cpusSocket0, MemoryBytes: tib},
				{ID: 1, CPUs: cpusSocket1, MemoryBytes: tib},
			},
		},
		Memory: inventory.Memory{TotalBytes: 2 * tib},
		OS: inventory.OS{
			ID: "ubuntu", VersionID: "22.04", PrettyName: "Ubuntu 22.04.4 LTS",
			Kernel: "5.15.0-105-generic", Arch: "x86_64", BootID: uuid(seed, "boot_id"),
		},
		Cgroups: inventory.Cgroups{Version: "v2",
			Controllers: []string{"cpu", "cpuset", "hugetlb", "io", "memory", "misc", "pids", "rdma"}},
		KVM:   inventory.KVM{Present: true},
		IOMMU: inventory.IOMMU{Units: 16, Groups: 212},
	}
	for i := 0; i < 10; i++ {
		d := inventory.Disk{
			Name:      fmt.Sprintf("nvme%dn1", i),
			Model:     "SAMSUNG MZQL23T8HCLS-00A07",
			SizeBytes: 3840755982336,
			Serial:    "S64H" + upperHex(seed, fmt.Sprintf("disk/%d/serial", i), 10),
			Transport: "nvme",
		}
		if i < 2 { // the mirrored boot pair
			d.Model, d.SizeBytes = "SAMSUNG MZ1L2960HCJR-00A07", 960197124096
		}
		inv.Disks = append(inv.Disks, d)
	}
	for _, n := range nics(seed) {
		inv.NICs = append(inv.NICs, n.NIC)
	}
	for i, bus := range gpuBuses() {
		minor := i
		inv.GPUs = append(inv.GPUs, inventory.GPU{
			UUID:     GPUUUID(seed, i),
			PCIBusID: busID(bus, 0),
			Model:    GPUName,
			VBIOS:    gpuVBIOS,
			Minor:    &minor,
		})
	}
	inv.MergeSMI(GPUs(seed))
	inv.Seal()
	return inv
}

// nic is a NIC with what topo -m needs to know of it.
type nic struct {
	inventory.NIC
	socket int
	gpu    int // the GPU it sits next to, or -1
}

// nics are the eight ConnectX-7 400G compute NICs, one per GPU, and the two
// ports of a ConnectX-6 Dx front-end NIC on socket 0.
func nics(seed int64) []nic {
	var out []nic
	for i, bus := range computeNICBuses() {
		out = append(out, nic{
			NIC: inventory.NIC{
				Name: fmt.Sprintf("enp%ds0np0", bus), MAC: mac(seed, fmt.Sprintf("nic/%d/mac", i), "b8:ce:f6"),
				Driver: "mlx5_core", PCIAddress: busID(bus, 0), PCIVendor: "0x15b3", PCIDevice: "0x1021",
				SpeedMbps: 400000, SRIOVTotalVFs: 16, RDMA: true, RDMADevices: []string{fmt.Sprintf("mlx5_%d", i)},
			},
			socket: socketOf(i),
			gpu:    i,
		})
	}
	for port := 0; port < 2; port++ {
		out = append(out, nic{
			NIC: inventory.NIC{
				Name: fmt.Sprintf("enp13s0f%dnp%d", port, port), MAC: mac(seed, fmt.Sprintf("nic/fe%d/mac", port), "0c:42:a1"),
				Driver: "mlx5_core", PCIAddress: busID(0x0d, port), PCIVendor: "0x15b3", PCIDevice: "0x101d",
				SpeedMbps: 100000, SRIOVTotalVFs: 8, RDMA: true, RDMADevices: []string{fmt.Sprintf("mlx5_%d", 8+port)},
			},
			socket: 0,
			gpu:    -1,
		})
	}
	return out
}

// GPUs returns the eight GPUs of the node made from seed as nvidia-smi
// reports them: ECC on and clean, row remapper clean, MIG off unless the
// seed says otherwise (MIGSeed), PCIe Gen5
// x16, 18 NVLinks each, all to all over the NVSwitches.
func GPUs(seed int64) []nvsmi.GPU {
	ns := nics(seed)
	var out []nvsmi.GPU
	for i, bus := range gpuBuses() {
		label := fmt.Sprintf("gpu/%d/", i)
		g := nvsmi.GPU{Info: nvsmi.Info{
			Index: i, UUID: GPUUUID(seed, i), Name: GPUName, Architecture: "Hopper",
			PCIBusID: busID(bus, 0), PCIDeviceID: "233010DE",
			Serial: "165" + digits(seed, label+"serial", 10), VBIOS: gpuVBIOS, BoardPart: "692-2G520-0200-000",
			DriverVersion: DriverVersion, CUDAVersion: CUDAVersion, ComputeCap: "9.0",
			MIG:         migOf(seed, i),
			Persistence: "Enabled", ComputeMode: "Default",
			PowerLimitW: 700, DefaultPowerLimitW: 700, MaxPowerLimitW: 700,
			MemoryTotalMiB: gpuMemoryMiB,
			ECC: nvsmi.ECC{Current: "Enabled", Pending: "Enabled",
				Volatile: nvsmi.ECCCounts{Supported: true}, Aggregate: nvsmi.ECCCounts{Supported: true}},
			RowRemap: &nvsmi.RowRemap{},
			PCIe:     nvsmi.PCIe{GenMax: 5, WidthMax: 16, WidthCurrent: 16},
			Fabric:   nvsmi.Fabric{State: "Completed", Status: "Success"},
		}}
		for l := 0; l < NVLinksPerGPU; l++ {
			g.NVLinks = append(g.NVLinks, nvsmi.NVLink{Link: l, Active: true, SpeedGBps: NVLinkGBps})
		}
		for j := 0; j < GPUCount; j++ {
			if j != i {
				g.Topology = append(g.Topology, nvsmi.TopoLink{Peer: GPUUUID(seed, j), Link: fmt.Sprintf("NV%d", NVLinksPerGPU)})
			}
		}
		for _, n := range ns {
			g.Topology = append(g.Topology, nvsmi.TopoLink{Peer: n.RDMADevices[0], Link: pathTo(i, n)})
		}
		sort.Slice(g.Topology, func(a, b int) bool { return g.Topology[a].Peer < g.Topology[b].Peer })
		g.CPUAffinity, g.NUMAAffinity = cpusSocket0, "0"
		if socketOf(i) == 1 {
			g.CPUAffinity, g.NUMAAffinity = cpusSocket1, "1"
		}
		used := 0
		g.Sample = nvsmi.Sample{
			PerformanceState: "P0",
			TemperatureC:     float64(29 + intn(seed, label+"temp", 8)),
			MemoryTempC:      float64(33 + intn(seed, label+"memtemp", 8)),
			PowerDrawW:       float64(66 + intn(seed, label+"power", 9)),
			MemoryUsedMiB:    int64(used),
			MemoryFreeMiB:    int64(gpuMemoryMiB - 544 - used),
			ClockGraphicsMHz: 1980, ClockSMMHz: 1980, ClockMemoryMHz: 2619,
			PCIeGenCurrent: 5,
		}
		out = append(out, g)
	}
	return out
}

// pathTo is how GPU i reaches NIC n in topo -m: through one PCIe switch
// to its own NIC, within the socket, or across the sockets.
func pathTo(i int, n nic) string {
	switch {
	case n.gpu == i:
		return "PIX"
	case n.socket == socketOf(i):
		return "NODE"
	}
	return "SYS"
}
