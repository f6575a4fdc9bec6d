package inventory

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// softwareDisk reports block devices made by software (or removable media
// a BMC attaches), which are not part of the hardware inventory.
func softwareDisk(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "dm-", "md", "nbd", "sr", "fd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func (r *reader) disks() []Disk {
	var out []Disk
	for _, name := range r.list("/sys/block") {
		if softwareDisk(name) {
			continue
		}
		dir := "/sys/block/" + name
		d := Disk{Name: name}
		if sectors, ok := r.int(dir + "/size"); ok && sectors > 0 {
			d.SizeBytes = uint64(sectors) * 512
		}
		d.Rotational = r.opt(dir+"/queue/rotational") == "1"
		d.Removable = r.opt(dir+"/removable") == "1"
		d.Model = r.opt(dir + "/device/model")
		d.Serial = r.opt(dir + "/device/serial")
		if d.Serial == "" {
			d.Serial = r.opt(dir + "/serial") // virtio-blk
		}
		if d.Serial == "" {
			d.Serial = r.vpdSerial(dir + "/device/vpd_pg80")
		}
		d.Transport = r.transport(name, dir)
		out = append(out, d)
	}
	return out
}

// vpdSerial reads the unit serial number from SCSI VPD page 0x80: a page
// code byte, a length at bytes 2-3, then the serial.
func (r *reader) vpdSerial(p string) string {
	b, err := os.ReadFile(r.path(p))
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	if 4+n > len(b) {
		n = len(b) - 4
	}
	return strings.TrimSpace(strings.Trim(string(b[4:4+n]), "\x00"))
}

func (r *reader) transport(name, dir string) string {
	switch {
	case strings.HasPrefix(name, "nvme"):
		return "nvme"
	case strings.HasPrefix(name, "vd"):
		return "virtio"
	case strings.HasPrefix(name, "mmcblk"):
		return "mmc"
	case strings.HasPrefix(name, "xvd"):
		return "xen"
	}
	// /sys/block/sda links to the device path, which names the bus:
	// …/ata1/host0/…, …/usb1/…, …/end_device-…/ (SAS), …/virtio3/….
	real, err := filepath.EvalSymlinks(r.path(dir))
	if err != nil {
		return ""
	}
	if root, err := filepath.EvalSymlinks(r.root); err == nil && root != "/" {
		real = strings.TrimPrefix(real, root)
	}
	for _, part := range strings.Split(filepath.ToSlash(real), "/") {
		switch {
		case strings.HasPrefix(part, "ata"):
			return "sata"
		case strings.HasPrefix(part, "usb"):
			return "usb"
		case strings.HasPrefix(part, "end_device-"):
			return "sas"
		case strings.HasPrefix(part, "virtio"):
			return "virtio"
		}
	}
	if strings.HasPrefix(name, "sd") {
		return "scsi"
	}
	return ""
}

// quiet reads p without noting errors: files like a down link's speed fail
// to read by design.
func (r *reader) quiet(p string) string {
	b, err := os.ReadFile(r.path(p))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (r *reader) nics() []NIC {
	var out []NIC
	for _, name := range r.list("/sys/class/net") {
		dir := "/sys/class/net/" + name
		if name == "lo" || !r.exists(dir+"/device") || r.exists(dir+"/device/physfn") {
			continue
		}
		n := NIC{
			Name:      name,
			MAC:       strings.ToLower(r.opt(dir + "/address")),
			Driver:    r.link(dir + "/device/driver"),
			PCIVendor: r.opt(dir + "/device/vendor"),
			PCIDevice: r.opt(dir + "/device/device"),
		}
		n.PCIAddress = r.pciAddress(dir + "/device")
		if s, err := strconv.Atoi(r.quiet(dir + "/speed")); err == nil && s > 0 {
			n.SpeedMbps = s
		}
		if v, ok := r.int(dir + "/device/sriov_totalvfs"); ok {
			n.SRIOVTotalVFs = int(v)
		}
		n.RDMADevices = r.list(dir + "/device/infiniband")
		n.RDMA = len(n.RDMADevices) > 0
		out = append(out, n)
	}
	return out
}

// pciAddress returns the PCI address of the device at p: its own name, or
// its parent's for a virtio device (…/0000:00:03.0/virtio0).
func (r *reader) pciAddress(p string) string {
	real, err := filepath.EvalSymlinks(r.path(p))
	if err != nil {
		return ""
	}
	for _, name := range []string{filepath.Base(real), filepath.Base(filepath.Dir(real))} {
		if isPCIAddress(name) {
			return name
		}
	}
	return ""
}

func isPCIAddress(s string) bool {
	return nvsmi.NormalizeBusID(s) == strings.ToLower(s) && strings.Count(s, ":") == 2 && strings.Contains(s, ".")
}

// gpus reads /proc/driver/nvidia/gpus/<bus id>/information.
func (r *reader) gpus() []GPU {
	var out []GPU
	for _, bus := range r.list("/proc/driver/nvidia/gpus") {
		s, ok := r.read("/proc/driver/nvidia/gpus/"+bus+"/information", true)
		if !ok {
			continue
		}
		g := GPU{PCIBusID: nvsmi.NormalizeBusID(bus)}
		for _, line := range strings.Split(s, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			// The driver writes N/A and the like where it has no value.
			v = nvsmi.Value(v)
			switch strings.TrimSpace(k) {
			case "Model":
				g.Model = v
			case "GPU UUID":
				// Without the rights to ask the GPU, the driver prints
				// GPU-????????-….
				if !strings.Contains(v, "?") {
					g.UUID = v
				}
			case "Video BIOS":
				if !strings.Contains(v, "?") {
					g.VBIOS = v
				}
			case "Bus Location":
				g.PCIBusID = nvsmi.NormalizeBusID(v)
			case "Device Minor":
				if n, err := strconv.Atoi(v); err == nil {
					g.Minor = &n
				}
			}
		}
		out = append(out, g)
	}
	return out
}
