// Package pcielink reads a PCI device's link from sysfs and what the port
// upstream of it (its slot) supports, and remembers each device's width
// first seen this boot, so a GPU at x8 in a slot wired x8 (many cloud
// instances and risers) can be told from a link that trained down.
//
// Read reads the real /sys; read is its twin over a root directory, so
// tests use a fake tree. First keeps the widths in a small JSON file under
// the data directory, keyed by the boot id.
package pcielink

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// Link is one device's PCIe link as sysfs shows it. Zero values are
// unknown.
type Link struct {
	// The device's own link.
	Width, WidthMax int
	Gen, GenMax     int
	// The port upstream of the device: the slot. Zero when the device
	// hangs directly off a root complex sysfs does not describe (common
	// in virtual machines).
	SlotWidthMax, SlotGenMax int
}

// Read reads the link of the PCI device at busID ("0000:17:00.0") from
// /sys.
func Read(busID string) (Link, error) { return read("/", busID) }

func read(root, busID string) (Link, error) {
	bus := nvsmi.NormalizeBusID(busID)
	if !isBusID(bus) {
		return Link{}, fmt.Errorf("read PCIe link: %q is not a PCI address", busID)
	}
	dev := filepath.Join(root, "sys/bus/pci/devices", bus)
	real, err := filepath.EvalSymlinks(dev)
	if err != nil {
		return Link{}, fmt.Errorf("read PCIe link of %s: %w", bus, err)
	}
	var l Link
	l.Width = readInt(filepath.Join(real, "current_link_width"))
	l.WidthMax = readInt(filepath.Join(real, "max_link_width"))
	l.Gen = readGen(filepath.Join(real, "current_link_speed"))
	l.GenMax = readGen(filepath.Join(real, "max_link_speed"))
	// The parent directory is the upstream port when it is a PCI device
	// itself ("0000:00:01.0"); "pci0000:00" is the root bus.
	up := filepath.Dir(real)
	if b := filepath.Base(up); isBusID(b) {
		l.SlotWidthMax = readInt(filepath.Join(up, "max_link_width"))
		l.SlotGenMax = readGen(filepath.Join(up, "max_link_speed"))
	}
	return l, nil
}

// isBusID reports whether s is a normalized PCI address, "0000:17:00.0",
// and nothing else (no path can hide in it).
func isBusID(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' || s[11] < '0' || s[11] > '7' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func readFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil || len(b) > 128 {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// readInt reads a width; the kernel writes 255 or 0 where it has none.
func readInt(p string) int {
	n, err := strconv.Atoi(readFile(p))
	if err != nil || n <= 0 || n > 32 {
		return 0
	}
	return n
}

// readGen turns a link speed ("16.0 GT/s PCIe", "8 GT/s", "2.5 GT/s") into
// its PCIe generation; 0 for "Unknown" and anything else.
func readGen(p string) int {
	f := strings.Fields(readFile(p))
	if len(f) < 2 || f[1] != "GT/s" {
		return 0
	}
	switch f[0] {
	case "2.5":
		return 1
	case "5", "5.0":
		return 2
	case "8", "8.0":
		return 3
	case "16", "16.0":
		return 4
	case "32", "32.0":
		return 5
	case "64", "64.0":
		return 6
	}
	return 0
}

// Apply completes each GPU's PCIe record from sysfs under root: the slot's
// maximum width and generation, and, where nvidia-smi gave none, the
// device's own widths. A GPU sysfs does not know is left as it is.
func Apply(root string, gpus []nvsmi.GPU) {
	for i := range gpus {
		l, err := read(root, gpus[i].PCIBusID)
		if err != nil {
			continue
		}
		p := &gpus[i].PCIe
		p.SlotWidthMax, p.SlotGenMax = l.SlotWidthMax, l.SlotGenMax
		if p.WidthCurrent == 0 {
			p.WidthCurrent = l.Width
		}
		if p.WidthMax == 0 {
			p.WidthMax = l.WidthMax
		}
	}
}

// firstFile is what First keeps: the boot it belongs to and each device's
// first width in it.
type firstFile struct {
	BootID string         `json:"boot_id"`
	Widths map[string]int `json:"widths"`
}

// maxFirstFile bounds the file First reads.
const maxFirstFile = 1 << 20

// First records, in the file at path, the current width of each GPU not
// yet seen this boot (bootID), and sets each GPU's FirstWidth to the width
// first recorded for it this boot. A file of another boot is replaced; a
// file that does not parse is replaced too, and reported, after the GPUs
// are completed from what is read now.
func First(path, bootID string, gpus []nvsmi.GPU) error {
	var f firstFile
	var perr error
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case len(b) > maxFirstFile:
		perr = fmt.Errorf("%s is larger than %d bytes; starting it again", path, maxFirstFile)
	default:
		if err := json.Unmarshal(b, &f); err != nil {
			perr = fmt.Errorf("decode %s: %w; starting it again", path, err)
			f = firstFile{}
		}
	}
	if f.BootID != bootID || f.Widths == nil {
		f = firstFile{BootID: bootID, Widths: map[string]int{}}
	}
	changed := perr != nil
	for i := range gpus {
		bus := nvsmi.NormalizeBusID(gpus[i].PCIBusID)
		w := gpus[i].PCIe.WidthCurrent
		if bus == "" {
			continue
		}
		first, ok := f.Widths[bus]
		if first < 1 || first > 32 {
			// No link is wider than x32: a value outside is not a width.
			ok = false
		}
		if !ok && w > 0 {
			f.Widths[bus], first, changed = w, w, true
		}
		if first >= 1 && first <= 32 {
			gpus[i].PCIe.FirstWidth = first
		}
	}
	if changed {
		out, err := json.Marshal(f)
		if err != nil {
			return err
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, out, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fmt.Errorf("rename %s: %w", tmp, err)
		}
	}
	return perr
}
