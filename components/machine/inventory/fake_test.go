package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tree builds a fake root with sysfs, procfs, /etc and /dev files.
type tree struct {
	t    *testing.T
	root string
}

func newTree(t *testing.T) *tree {
	return &tree{t: t, root: t.TempDir()}
}

func (tr *tree) file(p, content string) {
	tr.t.Helper()
	full := filepath.Join(tr.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) dir(p string) {
	tr.t.Helper()
	if err := os.MkdirAll(filepath.Join(tr.root, p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
}

// link makes p a symlink to target (both under the root), relative as in
// sysfs.
func (tr *tree) link(p, target string) {
	tr.t.Helper()
	full := filepath.Join(tr.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	tr.dir(target)
	rel, err := filepath.Rel(filepath.Dir(full), filepath.Join(tr.root, target))
	if err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Symlink(rel, full); err != nil {
		tr.t.Fatal(err)
	}
}

// twoSocketMachine builds a two-socket server: 2 sockets x 2 cores x 2
// threads, two NUMA nodes, an NVMe disk and a SATA disk (plus a loop and a
// dm device that are skipped), an onboard NIC, a ConnectX NIC with SR-IOV
// and RDMA (plus one of its VFs, a bridge and lo, skipped), an NVIDIA GPU
// in /proc/driver/nvidia, UEFI with Secure Boot on, a TPM 2.0, cgroup v2,
// /dev/kvm and an IOMMU. The serial number cannot be read (a directory
// stands in for a root-only file, since tests may run as root).
func twoSocketMachine(t *testing.T) *tree {
	tr := newTree(t)
	dmi := map[string]string{
		"sys_vendor": "Supermicro", "product_name": "SYS-821GE-TNHR",
		"product_uuid": "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
		"board_vendor": "Supermicro", "board_name": "X13DEG-OAD",
		"bios_vendor": "American Megatrends International, LLC.", "bios_version": "2.1", "bios_date": "01/12/2024",
	}
	for k, v := range dmi {
		tr.file("sys/class/dmi/id/"+k, v+"\n")
	}
	tr.dir("sys/class/dmi/id/product_serial")
	tr.file(secureBootVar, "\x06\x00\x00\x00\x01")
	tr.file("sys/class/tpm/tpm0/tpm_version_major", "2\n")

	var cpuinfo strings.Builder
	for cpu := 0; cpu < 8; cpu++ {
		pkg, core := cpu/4, (cpu/2)%2
		fmt.Fprintf(&cpuinfo, "processor\t: %d\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"+
			"physical id\t: %d\ncore id\t\t: %d\nflags\t\t: fpu vme de pse tsc msr vmx avx avx2 avx512f amx_tile aes pdpe1gb x2apic\n\n",
			cpu, pkg, core)
		dir := fmt.Sprintf("sys/devices/system/cpu/cpu%d/topology/", cpu)
		tr.file(dir+"physical_package_id", fmt.Sprintf("%d\n", pkg))
		tr.file(dir+"core_id", fmt.Sprintf("%d\n", core))
	}
	tr.file("sys/devices/system/cpu/online", "0-7\n")
	tr.file("proc/cpuinfo", cpuinfo.String())
	tr.file("sys/devices/system/node/node0/cpulist", "0-3\n")
	tr.file("sys/devices/system/node/node0/meminfo", "Node 0 MemTotal:       131072000 kB\nNode 0 MemFree:        1000 kB\n")
	tr.file("sys/devices/system/node/node1/cpulist", "4-7\n")
	tr.file("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal:       131072000 kB\n")
	tr.file("sys/devices/system/node/possible", "0-1\n")
	tr.file("proc/meminfo", "MemTotal:       262144000 kB\nMemFree:        200000000 kB\nHugePages_Total:       0\n")
	tr.file("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "1024\n")
	tr.file("sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "16\n")

	// NVMe: /sys/block/nvme0n1/device is the controller.
	tr.file("sys/block/nvme0n1/size", "7501476528\n")
	tr.file("sys/block/nvme0n1/queue/rotational", "0\n")
	tr.file("sys/block/nvme0n1/removable", "0\n")
	tr.link("sys/block/nvme0n1/device", "sys/devices/pci0000:00/0000:00:1d.0/0000:03:00.0/nvme/nvme0")
	tr.file("sys/devices/pci0000:00/0000:00:1d.0/0000:03:00.0/nvme/nvme0/model", "SAMSUNG MZQL23T8HCLS-00A07               \n")
	tr.file("sys/devices/pci0000:00/0000:00:1d.0/0000:03:00.0/nvme/nvme0/serial", "S64HNE0T123456      \n")
	// SATA: /sys/block/sda is a link into the ATA device path.
	sda := "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda"
	tr.link("sys/block/sda", sda)
	tr.file(sda+"/size", "1953525168\n")
	tr.file(sda+"/queue/rotational", "1\n")
	tr.file(sda+"/removable", "0\n")
	tr.link(sda+"/device", "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0")
	tr.file("sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/model", "ST1000NM0008-2F2\n")
	tr.file("sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/vpd_pg80", "\x00\x80\x00\x08ZFL1ABCD")
	tr.file("sys/block/loop0/size", "0\n")
	tr.file("sys/block/dm-0/size", "100\n")

	// NICs.
	tr.file("sys/class/net/lo/address", "00:00:00:00:00:00\n")
	tr.file("sys/class/net/br0/address", "02:42:ac:11:00:01\n")
	tr.file("sys/class/net/eno1/address", "3C:EC:EF:00:11:22\n")
	tr.file("sys/class/net/eno1/speed", "1000\n")
	tr.link("sys/class/net/eno1/device", "sys/devices/pci0000:00/0000:00:1f.6")
	tr.link("sys/devices/pci0000:00/0000:00:1f.6/driver", "sys/bus/pci/drivers/e1000e")
	tr.file("sys/devices/pci0000:00/0000:00:1f.6/vendor", "0x8086\n")
	tr.file("sys/devices/pci0000:00/0000:00:1f.6/device", "0x15b8\n")
	cx := "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0"
	tr.file("sys/class/net/ens1f0np0/address", "b8:ce:f6:aa:bb:cc\n")
	tr.dir("sys/class/net/ens1f0np0/speed") // a down link's speed fails to read
	tr.link("sys/class/net/ens1f0np0/device", cx)
	tr.link(cx+"/driver", "sys/bus/pci/drivers/mlx5_core")
	tr.file(cx+"/vendor", "0x15b3\n")
	tr.file(cx+"/device", "0x1021\n")
	tr.file(cx+"/sriov_totalvfs", "16\n")
	tr.dir(cx + "/infiniband/mlx5_0")
	vf := "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.2"
	tr.file("sys/class/net/ens1f0v0/address", "02:00:00:00:00:01\n")
	tr.link("sys/class/net/ens1f0v0/device", vf)
	tr.link(vf+"/physfn", cx)

	tr.file("proc/driver/nvidia/gpus/0000:18:00.0/information",
		"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 425\nGPU UUID: \t GPU-5f1c0000-1111-2222-3333-444455556666\n"+
			"Video BIOS: \t 96.00.74.00.0d\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"+
			"Bus Location: \t 0000:18:00.0\nDevice Minor: \t 0\nGPU Firmware: \t 550.54.15\nGPU Excluded:\t No\n")

	tr.file("etc/os-release", "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\n# a comment\n")
	tr.file("proc/sys/kernel/osrelease", "5.15.0-105-generic\n")
	tr.file("proc/sys/kernel/arch", "x86_64\n")
	tr.file("proc/sys/kernel/random/boot_id", "0f8e7c2a-5b4e-4d3c-9a1b-2c3d4e5f6a7b\n")
	tr.file("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
	tr.file("dev/kvm", "")
	tr.dir("sys/class/iommu/dmar0")
	tr.dir("sys/class/iommu/dmar1")
	for i := 0; i < 5; i++ {
		tr.dir(fmt.Sprintf("sys/kernel/iommu_groups/%d/devices", i))
	}
	return tr
}
