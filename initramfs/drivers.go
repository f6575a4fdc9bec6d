package initramfs

// Driver is a kernel module the ramdisk carries for hardware it may find
// on a server, loaded at boot only when one of the machine's devices asks
// for it (its modalias matches one of the module's device aliases), and
// why it is there.
type Driver struct {
	Name, Why string
}

// DefaultDrivers are the ramdisk's hardware drivers: the NICs and storage
// controllers of the servers GPU fleets run (HGX/DGX-class, OEM 1U/2U,
// cloud bare metal), and what QEMU emulates for the tests. Their
// dependencies come from the kernel's modules.dep; the firmware files
// they ask for are copied where the build machine has them (see
// docs/ramdisk.md: Debian ships most in non-free-firmware).
var DefaultDrivers = []Driver{
	// NICs.
	{"mlx5_core", "NVIDIA ConnectX-4 to 7 and BlueField: the compute and front-end NICs of HGX/DGX hosts"},
	{"ice", "Intel E810 100G: common front-end NIC on recent OEM servers"},
	{"i40e", "Intel X710/XL710/XXV710 10/25/40G"},
	{"ixgbe", "Intel 82599/X540/X550 10G"},
	{"igb", "Intel I350/I210 1G: the LOM and management ports of most OEM boards"},
	{"e1000e", "Intel 82574 and I217-I219 1G: workstation-class boards; QEMU's e1000e"},
	{"e1000", "Intel 8254x 1G: QEMU's default PXE NIC"},
	{"bnxt_en", "Broadcom NetXtreme-C/E 10-200G: Dell and HPE OCP NICs"},
	{"tg3", "Broadcom NetXtreme 1G: the LOM of many Dell and HPE servers"},
	{"ena", "AWS Elastic Network Adapter: EC2 bare-metal instances"},
	{"virtio_pci", "virtio devices on PCI: QEMU and cloud VMs"},
	{"virtio_net", "virtio network (on the virtio bus once virtio_pci is up)"},
	// Storage.
	{"nvme", "NVMe SSDs: the data and boot disks of GPU servers"},
	{"ahci", "SATA controllers in AHCI mode: boot SSDs on most boards; QEMU's ich9-ahci"},
	{"megaraid_sas", "Broadcom/LSI MegaRAID (PERC on Dell): RAID-attached disks; QEMU's megasas"},
	{"mpt3sas", "Broadcom/LSI SAS3 HBAs (Fusion-MPT): JBOD SAS/SATA disks"},
	{"smartpqi", "Microchip SmartRAID/SmartHBA (HPE Smart Array P-series Gen10+)"},
	{"hpsa", "HPE Smart Array before Gen10"},
	{"virtio_blk", "virtio disks: QEMU and cloud VMs"},
	{"virtio_scsi", "virtio SCSI: QEMU and cloud VMs"},
	// Entropy.
	{"virtio_rng", "virtio entropy source: QEMU, so TLS does not wait on the kernel's pool"},
}

// DriverNames are the names of drivers.
func DriverNames(drivers []Driver) []string {
	out := make([]string, len(drivers))
	for i, d := range drivers {
		out[i] = d.Name
	}
	return out
}

// VMDrivers are the drivers of an image for QEMU alone (the test installed
// OS): virtio, e1000, e1000e, NVMe.
var VMDrivers = []string{"virtio_pci", "virtio_net", "virtio_blk", "virtio_scsi", "virtio_rng", "e1000", "e1000e", "nvme"}
