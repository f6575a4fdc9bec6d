package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

func diff(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("%s: got\n%s\nwant\n%s", what, g, w)
	}
}

func intp(n int) *int { return &n }

func TestCollectTwoSocketMachine(t *testing.T) {
	tr := twoSocketMachine(t)
	inv := collect(context.Background(), tr.root, Options{})

	tests := []struct {
		section   string
		got, want any
	}{
		{"system", inv.System, System{
			Vendor: "Supermicro", Product: "SYS-821GE-TNHR", Serial: "",
			ProductUUID: "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
			BoardVendor: "Supermicro", BoardName: "X13DEG-OAD",
			BIOSVendor: "American Megatrends International, LLC.", BIOSVersion: "2.1", BIOSDate: "01/12/2024",
			UEFI: true, SecureBoot: "enabled", TPM: true, TPMVersion: "2",
		}},
		{"cpu", inv.CPU, CPU{
			Vendor: "GenuineIntel", Model: "Intel(R) Xeon(R) Platinum 8480+",
			Sockets: 2, Cores: 4, Threads: 8,
			Flags: []string{"aes", "amx_tile", "avx", "avx2", "avx512f", "pdpe1gb", "vmx", "x2apic"},
			NUMA: []NUMANode{
				{ID: 0, CPUs: "0-3", MemoryBytes: 131072000 * 1024},
				{ID: 1, CPUs: "4-7", MemoryBytes: 131072000 * 1024},
			},
		}},
		{"memory", inv.Memory, Memory{TotalBytes: 262144000 * 1024, HugePages2M: 1024, HugePages1G: 16}},
		{"disks", inv.Disks, []Disk{
			{Name: "nvme0n1", SizeBytes: 7501476528 * 512, Model: "SAMSUNG MZQL23T8HCLS-00A07", Serial: "S64HNE0T123456", Transport: "nvme"},
			{Name: "sda", SizeBytes: 1953525168 * 512, Rotational: true, Model: "ST1000NM0008-2F2", Serial: "ZFL1ABCD", Transport: "sata"},
		}},
		{"nics", inv.NICs, []NIC{
			{Name: "eno1", MAC: "3c:ec:ef:00:11:22", Driver: "e1000e", PCIAddress: "0000:00:1f.6",
				PCIVendor: "0x8086", PCIDevice: "0x15b8", SpeedMbps: 1000},
			{Name: "ens1f0np0", MAC: "b8:ce:f6:aa:bb:cc", Driver: "mlx5_core", PCIAddress: "0000:17:00.0",
				PCIVendor: "0x15b3", PCIDevice: "0x1021", SRIOVTotalVFs: 16, RDMA: true, RDMADevices: []string{"mlx5_0"}},
		}},
		{"gpus", inv.GPUs, []GPU{{
			UUID: "GPU-5f1c0000-1111-2222-3333-444455556666", PCIBusID: "0000:18:00.0",
			Model: "NVIDIA H100 80GB HBM3", VBIOS: "96.00.74.00.0d", Minor: intp(0),
		}}},
		{"os", inv.OS, OS{ID: "ubuntu", VersionID: "22.04", PrettyName: "Ubuntu 22.04.4 LTS",
			Kernel: "5.15.0-105-generic", Arch: "x86_64", BootID: "0f8e7c2a-5b4e-4d3c-9a1b-2c3d4e5f6a7b"}},
		{"cgroups", inv.Cgroups, Cgroups{Version: "v2",
			Controllers: []string{"cpu", "cpuset", "hugetlb", "io", "memory", "misc", "pids", "rdma"}}},
		{"kvm", inv.KVM, KVM{Present: true}},
		{"iommu", inv.IOMMU, IOMMU{Units: 2, Groups: 5}},
		{"notes", inv.Notes, []string{"read /sys/class/dmi/id/product_serial: is a directory"}},
	}
	for _, tt := range tests {
		diff(t, tt.section, tt.got, tt.want)
	}
}

func TestCollectOtherLayouts(t *testing.T) {
	tests := []struct {
		name  string
		build func(tr *tree)
		check func(t *testing.T, inv *Inventory)
	}{
		{
			name:  "empty root: everything noted, nothing fails",
			build: func(*tree) {},
			check: func(t *testing.T, inv *Inventory) {
				for _, p := range []string{"/proc/cpuinfo", "/proc/meminfo", "/etc/os-release", "/proc/sys/kernel/osrelease"} {
					if !containsPrefix(inv.Notes, "read "+p+":") {
						t.Errorf("no note for %s in %q", p, inv.Notes)
					}
				}
				if inv.KVM.Present || inv.System.UEFI || len(inv.Disks) != 0 || inv.Cgroups.Version != "" {
					t.Errorf("inventory of nothing: %+v", inv)
				}
			},
		},
		{
			name: "cgroup v1, BIOS boot, virtio disk and NIC, GPU without rights",
			build: func(tr *tree) {
				for _, c := range []string{"cpu,cpuacct", "memory", "pids", "unified"} {
					tr.dir("sys/fs/cgroup/" + c)
				}
				tr.link("sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct")
				tr.file("sys/block/vda/size", "41943040\n")
				tr.file("sys/block/vda/serial", "disk-1\n")
				tr.link("sys/block/vda/device", "sys/devices/pci0000:00/0000:00:04.0/virtio1")
				tr.file("sys/class/net/ens3/address", "52:54:00:12:34:56\n")
				tr.file("sys/class/net/ens3/speed", "-1\n")
				tr.link("sys/class/net/ens3/device", "sys/devices/pci0000:00/0000:00:03.0/virtio0")
				tr.link("sys/devices/pci0000:00/0000:00:03.0/virtio0/driver", "sys/bus/virtio/drivers/virtio_net")
				tr.file("proc/driver/nvidia/gpus/0000:3b:00.0/information",
					"Model: \t\t Tesla T4\nGPU UUID: \t GPU-????????-????-????-????-????????????\nVideo BIOS: \t ??.??.??.??.??\nBus Location: \t 0000:3b:00.0\n")
				// A driver that cannot read a value prints a word for it.
				tr.file("proc/driver/nvidia/gpus/0000:3c:00.0/information",
					"Model: \t\t Unknown Error\nGPU UUID: \t Not Found\nVideo BIOS: \t [N/A]\nBus Location: \t 0000:3c:00.0\n")
				tr.file("proc/cpuinfo", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nphysical id\t: 0\ncore id\t: 0\nflags\t: svm sev avx2\n\n"+
					"processor\t: 1\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nphysical id\t: 0\ncore id\t: 1\nflags\t: svm sev avx2\n")
			},
			check: func(t *testing.T, inv *Inventory) {
				diff(t, "cgroups", inv.Cgroups, Cgroups{Version: "hybrid", Controllers: []string{"cpu,cpuacct", "memory", "pids"}})
				diff(t, "disks", inv.Disks, []Disk{{Name: "vda", SizeBytes: 41943040 * 512, Serial: "disk-1", Transport: "virtio"}})
				diff(t, "nics", inv.NICs, []NIC{{Name: "ens3", MAC: "52:54:00:12:34:56", Driver: "virtio_net", PCIAddress: "0000:00:03.0"}})
				diff(t, "gpus", inv.GPUs, []GPU{{PCIBusID: "0000:3b:00.0", Model: "Tesla T4"}, {PCIBusID: "0000:3c:00.0"}})
				diff(t, "cpu", inv.CPU, CPU{Vendor: "AuthenticAMD", Model: "AMD EPYC", Sockets: 1, Cores: 2, Threads: 2,
					Flags: []string{"avx2", "sev", "svm"}})
				if inv.System.UEFI || inv.System.SecureBoot != "" {
					t.Errorf("system %+v", inv.System)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTree(t)
			tt.build(tr)
			inv := collect(context.Background(), tr.root, Options{})
			tt.check(t, inv)
			inv.Seal()
			if len(inv.SectionHashes) != 10 || !strings.HasPrefix(inv.Hash, "sha256:") {
				t.Errorf("hashes %v %q", inv.SectionHashes, inv.Hash)
			}
		})
	}
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// smiXML is the GPU of twoSocketMachine as nvidia-smi reports it, and a
// second GPU that /proc did not show.
func smiXML(tempC, powerW string) string {
	return `<?xml version="1.0" ?><nvidia_smi_log><driver_version>550.54.15</driver_version><cuda_version>12.4</cuda_version>
<gpu id="00000000:18:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>GPU-5f1c0000-1111-2222-3333-444455556666</uuid>
<pci><pci_bus_id>00000000:18:00.0</pci_bus_id></pci><persistence_mode>Enabled</persistence_mode>
<fb_memory_usage><total>81559 MiB</total><used>71234 MiB</used></fb_memory_usage>
<temperature><gpu_temp>` + tempC + `</gpu_temp></temperature>
<gpu_power_readings><power_draw>` + powerW + `</power_draw><current_power_limit>700.00 W</current_power_limit></gpu_power_readings>
<utilization><gpu_util>87 %</gpu_util></utilization>
<processes><process_info><pid>4242</pid><type>C</type><process_name>python</process_name><used_memory>71000 MiB</used_memory></process_info></processes>
</gpu>
<gpu id="00000000:2A:00.0"><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>GPU-9a020000-1111-2222-3333-444455556666</uuid></gpu>
</nvidia_smi_log>`
}

func smiRunner(xml string) nvsmi.Runner {
	return func(_ context.Context, args ...string) ([]byte, error) {
		if strings.Join(args, " ") == "-q -x" {
			return []byte(xml), nil
		}
		return nil, errors.New("exit status 2")
	}
}

func TestCollectMergesSMI(t *testing.T) {
	tr := twoSocketMachine(t)
	inv := collect(context.Background(), tr.root, Options{SMI: smiRunner(smiXML("61 C", "540.00 W"))})
	if len(inv.GPUs) != 2 {
		t.Fatalf("got %d GPUs, want 2", len(inv.GPUs))
	}
	g := inv.GPUs[0]
	if g.Minor == nil || g.SMI == nil || g.SMI.PowerLimitW != 700 || g.SMI.Persistence != "Enabled" || g.SMI.MemoryTotalMiB != 81559 {
		t.Errorf("merged GPU %+v, SMI %+v", g, g.SMI)
	}
	if g2 := inv.GPUs[1]; g2.UUID != "GPU-9a020000-1111-2222-3333-444455556666" || g2.PCIBusID != "0000:2a:00.0" || g2.SMI == nil {
		t.Errorf("GPU only nvidia-smi knows: %+v", g2)
	}
	if len(inv.Live.GPUs) != 2 {
		t.Fatalf("got %d samples, want 2", len(inv.Live.GPUs))
	}
	s := inv.Live.GPUs[0]
	if s.UUID != g.UUID || s.Sample.TemperatureC != 61 || s.Sample.PowerDrawW != 540 || s.Sample.MemoryUsedMiB != 71234 ||
		len(s.Sample.Processes) != 1 {
		t.Errorf("sample %+v", s)
	}
	if !containsPrefix(inv.Notes, "nvidia-smi -L:") {
		t.Errorf("the failed optional nvidia-smi commands are not noted: %q", inv.Notes)
	}

	t.Run("by PCI address when /proc hides the UUID", func(t *testing.T) {
		inv := &Inventory{GPUs: []GPU{{PCIBusID: "0000:18:00.0", Model: "NVIDIA H100 80GB HBM3"}}}
		gpus, _ := nvsmi.ParseXML(strings.NewReader(smiXML("30 C", "70 W")))
		inv.MergeSMI(gpus)
		if len(inv.GPUs) != 2 || inv.GPUs[0].UUID != "GPU-5f1c0000-1111-2222-3333-444455556666" {
			t.Errorf("GPUs %+v", inv.GPUs)
		}
	})
	t.Run("no nvidia-smi", func(t *testing.T) {
		inv := collect(context.Background(), tr.root, Options{SMI: nvsmi.ExecRunner(filepath.Join(t.TempDir(), "nvidia-smi"))})
		if len(inv.GPUs) != 1 || !containsPrefix(inv.Notes, "nvidia-smi -q -x: nvidia-smi not found") {
			t.Errorf("GPUs %+v, notes %q", inv.GPUs, inv.Notes)
		}
	})
}

func TestHashesStable(t *testing.T) {
	tr := twoSocketMachine(t)
	opts := Options{SMI: smiRunner(smiXML("61 C", "540.00 W"))}
	a := collect(context.Background(), tr.root, opts)
	b := collect(context.Background(), tr.root, opts)
	a.Seal()
	b.Seal()
	if a.Hash != b.Hash || !reflect.DeepEqual(a.SectionHashes, b.SectionHashes) {
		t.Fatalf("two collections of one machine hash differently:\n%v\n%v", a.SectionHashes, b.SectionHashes)
	}
	if a.Hash != OverallHash(a.SectionHashes) {
		t.Errorf("Hash %s is not the hash of the section hashes", a.Hash)
	}
	want := a.Sections()
	for i := 0; i < 50; i++ {
		if got := a.Sections(); !reflect.DeepEqual(got, want) {
			t.Fatalf("run %d: sections changed", i)
		}
	}

	// Order of discovery does not matter.
	reverse := func(n int, swap func(i, j int)) {
		for i, j := 0, n-1; i < j; i, j = i+1, j-1 {
			swap(i, j)
		}
	}
	reverse(len(b.Disks), func(i, j int) { b.Disks[i], b.Disks[j] = b.Disks[j], b.Disks[i] })
	reverse(len(b.NICs), func(i, j int) { b.NICs[i], b.NICs[j] = b.NICs[j], b.NICs[i] })
	reverse(len(b.GPUs), func(i, j int) { b.GPUs[i], b.GPUs[j] = b.GPUs[j], b.GPUs[i] })
	reverse(len(b.CPU.Flags), func(i, j int) { b.CPU.Flags[i], b.CPU.Flags[j] = b.CPU.Flags[j], b.CPU.Flags[i] })
	reverse(len(b.CPU.NUMA), func(i, j int) { b.CPU.NUMA[i], b.CPU.NUMA[j] = b.CPU.NUMA[j], b.CPU.NUMA[i] })
	reverse(len(b.Cgroups.Controllers), func(i, j int) {
		b.Cgroups.Controllers[i], b.Cgroups.Controllers[j] = b.Cgroups.Controllers[j], b.Cgroups.Controllers[i]
	})
	if !reflect.DeepEqual(b.Hashes(), a.SectionHashes) {
		t.Errorf("reordered slices change the hashes")
	}
	if b.Disks[0].Name != "sda" {
		t.Errorf("Sections sorted the inventory itself")
	}

	// Canonical form: sorted keys, no whitespace.
	kvm := string(want[SectionKVM])
	if kvm != `{"present":true}` {
		t.Errorf("kvm section = %s", kvm)
	}
	if mem := string(want[SectionMemory]); mem != `{"hugepages_1g":16,"hugepages_2m":1024,"total_bytes":268435456000}` {
		t.Errorf("memory section = %s", mem)
	}
	for name, sec := range want {
		if strings.ContainsAny(string(sec), "\n\t") || strings.Contains(string(sec), "null") {
			t.Errorf("section %s is not canonical: %s", name, sec)
		}
	}
}

func TestLiveSamplesAreNotHashed(t *testing.T) {
	tr := twoSocketMachine(t)
	a := collect(context.Background(), tr.root, Options{SMI: smiRunner(smiXML("61 C", "540.00 W"))})
	a.Seal()
	before := a.SectionHashes

	a.Live.GPUs[0].Sample.TemperatureC = 90
	a.Live.GPUs[0].Sample.Processes = nil
	if !reflect.DeepEqual(a.Hashes(), before) {
		t.Error("a changed live sample changed a hash")
	}
	// A new nvidia-smi reading with other samples leaves the hashes too.
	b := collect(context.Background(), tr.root, Options{SMI: smiRunner(smiXML("34 C", "72.00 W"))})
	if !reflect.DeepEqual(b.Hashes(), before) {
		t.Error("a new reading of the same GPUs changed a hash")
	}
	if b.Live.GPUs[0].Sample.TemperatureC != 34 {
		t.Errorf("sample %+v", b.Live.GPUs[0].Sample)
	}
}

func TestChangeHashesOnlyItsSection(t *testing.T) {
	tests := []struct {
		name    string
		change  func(tr *tree)
		section string
	}{
		{"a disk grows", func(tr *tree) { tr.file("sys/block/nvme0n1/size", "15002953056\n") }, SectionDisks},
		{"a NIC's link comes up", func(tr *tree) {
			os.Remove(filepath.Join(tr.root, "sys/class/net/ens1f0np0/speed"))
			tr.file("sys/class/net/ens1f0np0/speed", "400000\n")
		}, SectionNICs},
		{"a reboot", func(tr *tree) { tr.file("proc/sys/kernel/random/boot_id", "11111111-2222-3333-4444-555555555555\n") }, SectionOS},
		{"huge pages", func(tr *tree) { tr.file("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "32\n") }, SectionMemory},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := twoSocketMachine(t)
			before := collect(context.Background(), tr.root, Options{}).Hashes()
			tt.change(tr)
			after := collect(context.Background(), tr.root, Options{}).Hashes()
			for name, h := range before {
				if changed := after[name] != h; changed != (name == tt.section) {
					t.Errorf("section %s changed: %v", name, changed)
				}
			}
		})
	}
}

func TestCanonical(t *testing.T) {
	type inner struct {
		Z string   `json:"z"`
		A []int    `json:"a"`
		N *int     `json:"n"`
		E []string `json:"e"`
	}
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"sorted keys, no whitespace", map[string]any{"b": 1, "a": "x", "c": true}, `{"a":"x","b":1,"c":true}`},
		{"struct fields sorted, nulls and empty lists dropped", inner{Z: "z", A: []int{3, 1}}, `{"a":[3,1],"z":"z"}`},
		{"empty list and nil list alike", []inner{{E: []string{}}, {}}, `[{"z":""},{"z":""}]`},
		{"no HTML escaping", map[string]string{"m": "a<b>&c"}, `{"m":"a<b>&c"}`},
		{"numbers as written", map[string]any{"f": 26.562, "i": uint64(18446744073709551615), "z": 0.0}, `{"f":26.562,"i":18446744073709551615,"z":0}`},
		{"nested empty objects dropped", map[string]any{"a": map[string]any{"b": nil}, "c": 1}, `{"c":1}`},
		{"unicode kept", map[string]string{"k": "é…"}, `{"k":"é…"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
	if _, err := Canonical(func() {}); err == nil {
		t.Error("a func encoded")
	}
}

// TestCollectRealMachine reads this machine; it only checks that nothing
// fails (CI runs in a VM without GPUs).
func TestCollectRealMachine(t *testing.T) {
	inv, err := Collect(context.Background(), Options{SMI: nvsmi.ExecRunner("")})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Schema != Schema || len(inv.SectionHashes) != 10 || !strings.HasPrefix(inv.Hash, "sha256:") {
		t.Errorf("schema %q, hashes %v, hash %q", inv.Schema, inv.SectionHashes, inv.Hash)
	}
	if inv.CPU.Threads == 0 || inv.Memory.TotalBytes == 0 || inv.OS.Kernel == "" || inv.OS.Arch == "" {
		t.Errorf("cpu %+v, memory %+v, os %+v", inv.CPU, inv.Memory, inv.OS)
	}
	t.Logf("notes: %q", inv.Notes)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Collect(ctx, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled Collect: %v", err)
	}
}
