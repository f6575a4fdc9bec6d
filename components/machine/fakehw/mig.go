package fakehw

import (
	"bytes"
	"fmt"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// MIG on the fake machine is chosen by the seed: bit i of seed>>16 puts
// GPU i in MIG mode, so every seed below 65536 (the ones tests and bcd sim
// use by default) has none, and MIGSeed makes one that has. A GPU in MIG
// mode carries the same three instances: 3g.40gb, 2g.20gb and 1g.10gb,
// each a GPU instance with one compute instance.

// MIGSeed returns seed with the GPUs gpus (0 to 7) in MIG mode.
func MIGSeed(seed int64, gpus ...int) int64 {
	seed &= 0xffff
	for _, g := range gpus {
		seed |= int64(1) << (16 + g)
	}
	return seed
}

// InMIG reports whether GPU i of the machine of seed is in MIG mode.
func InMIG(seed int64, i int) bool { return seed > 0 && (seed>>16)>>i&1 == 1 }

// migInstance is one MIG instance of the fixed layout.
type migInstance struct {
	profile       string
	profileID, gi int
	sms           int
	memoryMiB     int64
	total, memGiB int
}

var migLayout = []migInstance{
	{profile: "3g.40gb", profileID: 9, gi: 2, sms: 60, memoryMiB: 40448, total: 2, memGiB: 40},
	{profile: "2g.20gb", profileID: 14, gi: 3, sms: 32, memoryMiB: 20096, total: 3, memGiB: 20},
	{profile: "1g.10gb", profileID: 19, gi: 9, sms: 16, memoryMiB: 9856, total: 7, memGiB: 10},
}

// MIGUUID is the UUID of MIG device d of GPU i.
func MIGUUID(seed int64, i, d int) string {
	return "MIG-" + uuid(seed, fmt.Sprintf("gpu/%d/mig/%d", i, d))
}

// migOf is GPU i's MIG state as nvidia-smi reports it.
func migOf(seed int64, i int) nvsmi.MIG {
	if !InMIG(seed, i) {
		return nvsmi.MIG{Current: "Disabled", Pending: "Disabled"}
	}
	m := nvsmi.MIG{Current: "Enabled", Pending: "Enabled"}
	for d, in := range migLayout {
		m.Devices = append(m.Devices, nvsmi.MIGDevice{Index: d, UUID: MIGUUID(seed, i, d), Profile: in.profile,
			GPUInstanceID: in.gi, ComputeInstanceID: 0, Multiprocessors: in.sms, MemoryTotalMiB: in.memoryMiB})
		m.Profiles = append(m.Profiles, nvsmi.MIGProfile{GPU: i, Name: in.profile, ID: in.profileID,
			Free: in.total - 1, Total: in.total, MemoryGiB: float64(in.memGiB)})
	}
	return m
}

// migXML writes a GPU's <mig_devices> element.
func migXML(w func(depth int, f string, a ...any), g nvsmi.GPU) {
	w(2, "<mig_devices>")
	if len(g.MIG.Devices) == 0 {
		w(3, "None")
	}
	for _, d := range g.MIG.Devices {
		w(3, "<mig_device>")
		w(4, "<index>%d</index>", d.Index)
		w(4, "<gpu_instance_id>%d</gpu_instance_id>", d.GPUInstanceID)
		w(4, "<compute_instance_id>%d</compute_instance_id>", d.ComputeInstanceID)
		w(4, "<device_attributes><shared><multiprocessor_count>%d</multiprocessor_count></shared></device_attributes>", d.Multiprocessors)
		w(4, "<fb_memory_usage><total>%d MiB</total><used>0 MiB</used><free>%d MiB</free></fb_memory_usage>", d.MemoryTotalMiB, d.MemoryTotalMiB)
		w(3, "</mig_device>")
	}
	w(2, "</mig_devices>")
}

// migProfiles writes `nvidia-smi mig -lgip` for the MIG GPUs; none fails
// as nvidia-smi does.
func migProfiles(gpus []nvsmi.GPU) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("+-----------------------------------------------------------------------------+\n" +
		"| GPU instance profiles:                                                      |\n" +
		"| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |\n" +
		"|                              Free/Total   GiB              CE    JPEG  OFA  |\n" +
		"|=============================================================================|\n")
	n := 0
	for _, g := range gpus {
		for _, p := range g.MIG.Profiles {
			fmt.Fprintf(&b, "|   %d  MIG %-13s %3d     %d/%d        %5.2f      No     %-3d  %-3d   %-3d  |\n",
				g.Index, p.Name, p.ID, p.Free, p.Total, p.MemoryGiB, 0, 0, 0)
			b.WriteString("|                                                               1     0     0    |\n")
			n++
		}
	}
	if n == 0 {
		return []byte("No MIG-enabled devices found.\n"), fmt.Errorf("exit status 6")
	}
	b.WriteString("+-----------------------------------------------------------------------------+\n")
	return b.Bytes(), nil
}

// MIGCaps is the fake machine's /proc/driver/nvidia-caps/mig-minors.
func MIGCaps() []byte { return cdispec.RenderMIGCaps() }

// DeviceNode is a character device of the fake machine, with the numbers
// its driver would give it.
type DeviceNode struct {
	Path         string
	Major, Minor uint32
}

// The fake machine's device numbers: nvidia's major is fixed (195) on
// every host; nvidia-uvm's and nvidia-caps' are dynamic, these are the
// fake's.
const (
	nvidiaMajor = 195
	uvmMajor    = 509
	capsMajor   = 508
)

// DeviceNodes are the device nodes of the machine of seed: a
// /dev/nvidia<minor> per GPU, the control devices, and the access
// capability nodes of each MIG instance's GPU and compute instance. A
// test creates them (mknod) under a root of its own so that a real
// container runtime can be pointed at them.
func DeviceNodes(seed int64) []DeviceNode {
	var out []DeviceNode
	caps, _ := cdispec.ParseMIGCaps(MIGCaps())
	for i, g := range GPUs(seed) {
		out = append(out, DeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", i), Major: nvidiaMajor, Minor: uint32(i)})
		for _, d := range g.MIG.Devices {
			for _, name := range []string{fmt.Sprintf("gpu%d/gi%d/access", i, d.GPUInstanceID),
				fmt.Sprintf("gpu%d/gi%d/ci%d/access", i, d.GPUInstanceID, d.ComputeInstanceID)} {
				m := caps[name]
				out = append(out, DeviceNode{Path: cdispec.CapNode(m), Major: capsMajor, Minor: uint32(m)})
			}
		}
	}
	return append(out,
		DeviceNode{Path: "/dev/nvidiactl", Major: nvidiaMajor, Minor: 255},
		DeviceNode{Path: "/dev/nvidia-uvm", Major: uvmMajor, Minor: 0},
		DeviceNode{Path: "/dev/nvidia-uvm-tools", Major: uvmMajor, Minor: 1})
}
