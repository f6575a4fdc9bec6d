package rdinit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/disk/kmod"
)

// TestLoadDrivers: of the image's drivers, only those a device's
// modalias asks for load, in rounds (virtio_pci brings up the virtio
// device that asks for virtio_blk), each named with its device.
func TestLoadDrivers(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "sys/bus")
	dev := func(bus, name, alias string) {
		d := filepath.Join(sys, bus, "devices", name)
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "modalias"), []byte(alias+"\n"), 0o444)
	}
	dev("pci", "0000:00:02.0", "pci:v00008086d000010D3sv00008086sd00000000bc02sc00i00")
	dev("pci", "0000:00:03.0", "pci:v00001AF4d00001001sv00001AF4sd00000002bc01sc00i00")
	dev("pci", "0000:00:04.0", "pci:v00001000d00000060sv00001000sd00001013bc01sc04i00")
	list := filepath.Join(dir, "drivers")
	os.WriteFile(list, []byte("# drivers\ne1000e\nvirtio_pci\nvirtio_blk\nmegaraid_sas\nmlx5_core\n"), 0o644)
	aliases := map[string][]string{
		"pci:v00008086d000010D3": {"e1000e"},
		"pci:v00001AF4":          {"virtio_pci"},
		"pci:v00001000d00000060": {"megaraid_sas", "not_in_image"},
		"virtio:d00000002":       {"virtio_blk"},
	}
	var loads [][]string
	var out strings.Builder
	c := Config{DriversList: list, SysBus: sys,
		Match: func(m string) []string {
			for prefix, mods := range aliases {
				if strings.HasPrefix(m, prefix) {
					return mods
				}
			}
			return nil
		},
		Load: func(names []string) ([]kmod.Result, error) {
			loads = append(loads, names)
			var rs []kmod.Result
			for _, n := range names {
				rs = append(rs, kmod.Result{Module: kmod.Module{Name: n}, State: kmod.Loaded})
				if n == "virtio_pci" {
					dev("virtio", "virtio0", "virtio:d00000002v00001AF4")
				}
			}
			return rs, nil
		}}
	loadDrivers(c, func(f string, a ...any) { fmt.Fprintf(&out, f+"\n", a...) })
	if fmt.Sprint(loads) != "[[e1000e virtio_pci megaraid_sas] [virtio_blk]]" {
		t.Errorf("loads %v", loads)
	}
	for _, want := range []string{"driver e1000e for pci 0000:00:02.0 (pci:v00008086d000010D3",
		"driver virtio_blk for virtio virtio0", "drivers loaded for this machine: e1000e virtio_pci megaraid_sas virtio_blk"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "mlx5_core") || strings.Contains(out.String(), "not_in_image") {
		t.Errorf("a driver no device asks for, or one not in the image, was named:\n%s", out.String())
	}
}

// TestController: a disk is named with the PCI device (and its driver)
// it sits behind.
func TestController(t *testing.T) {
	dir := t.TempDir()
	pci := filepath.Join(dir, "devices/pci0000:00/0000:00:04.0")
	disk := filepath.Join(pci, "host0/target0:2:0/0:2:0:0")
	os.MkdirAll(filepath.Join(disk, "block/sda"), 0o755)
	os.MkdirAll(filepath.Join(dir, "bus/pci/drivers/megaraid_sas"), 0o755)
	os.MkdirAll(filepath.Join(dir, "bus/scsi/drivers/sd"), 0o755)
	os.Symlink(filepath.Join(dir, "bus/pci"), filepath.Join(pci, "subsystem"))
	os.Symlink(filepath.Join(dir, "bus/pci/drivers/megaraid_sas"), filepath.Join(pci, "driver"))
	os.Symlink(filepath.Join(dir, "bus/scsi"), filepath.Join(disk, "subsystem"))
	os.Symlink(filepath.Join(dir, "bus/scsi/drivers/sd"), filepath.Join(disk, "driver"))
	class := filepath.Join(dir, "class/block/sda")
	os.MkdirAll(class, 0o755)
	os.Symlink(disk, filepath.Join(class, "device"))
	os.WriteFile(filepath.Join(class, "size"), []byte("196608\n"), 0o444)
	if got := blockDevices(filepath.Join(dir, "class/block")); fmt.Sprint(got) != "[sda (96 MiB) [megaraid_sas@0000:00:04.0]]" {
		t.Errorf("blockDevices = %v", got)
	}
}
