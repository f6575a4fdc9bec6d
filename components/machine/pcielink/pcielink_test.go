package pcielink

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// tree builds a fake sysfs: each device is a directory under its parent
// (a bridge or the root bus), linked from sys/bus/pci/devices.
type tree struct {
	t    *testing.T
	root string
}

func (tr tree) file(p, s string) {
	p = filepath.Join(tr.root, p)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

// device writes a device at path (under sys/devices) with its link files
// (empty values are left out) and links it from sys/bus/pci/devices.
func (tr tree) device(path, width, widthMax, speed, speedMax string) {
	for name, v := range map[string]string{"current_link_width": width, "max_link_width": widthMax,
		"current_link_speed": speed, "max_link_speed": speedMax} {
		if v != "" {
			tr.file(filepath.Join("sys/devices", path, name), v)
		}
	}
	link := filepath.Join(tr.root, "sys/bus/pci/devices", filepath.Base(path))
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(tr.root, "sys/devices", path), link); err != nil {
		tr.t.Fatal(err)
	}
}

func TestRead(t *testing.T) {
	tr := tree{t, t.TempDir()}
	// A GPU behind a x8 root port (a slot wired x8), a GPU behind a
	// switch port of x16 trained at x4, and a GPU in a VM, hanging off
	// the root bus.
	tr.device("pci0000:00/0000:00:01.0", "8", "8", "16.0 GT/s PCIe", "16.0 GT/s PCIe")
	tr.device("pci0000:00/0000:00:01.0/0000:17:00.0", "8", "16", "2.5 GT/s PCIe", "16.0 GT/s PCIe")
	tr.device("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0", "16", "16", "32.0 GT/s PCIe", "32.0 GT/s PCIe")
	tr.device("pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:08.0/0000:83:00.0", "4", "16", "32.0 GT/s PCIe", "32.0 GT/s PCIe")
	tr.device("pci0000:00/0000:00:1e.0", "8", "16", "8.0 GT/s PCIe", "8.0 GT/s PCIe")
	tr.device("pci0000:00/0000:00:05.0", "255", "0", "Unknown", "")

	tests := []struct {
		bus  string
		want Link
	}{
		{"0000:17:00.0", Link{Width: 8, WidthMax: 16, Gen: 1, GenMax: 4, SlotWidthMax: 8, SlotGenMax: 4}},
		{"00000000:83:00.0", Link{Width: 4, WidthMax: 16, Gen: 5, GenMax: 5, SlotWidthMax: 16, SlotGenMax: 5}},
		{"0000:00:1E.0", Link{Width: 8, WidthMax: 16, Gen: 3, GenMax: 3}},
		{"0000:00:05.0", Link{}},
	}
	for _, tt := range tests {
		got, err := read(tr.root, tt.bus)
		if err != nil || got != tt.want {
			t.Errorf("read(%s) = %+v, %v; want %+v", tt.bus, got, err, tt.want)
		}
	}
	for _, bad := range []string{"0000:99:00.0", "GPU-1", "", "../../etc", "0000:17:00.0/../..", "0000:17:00.0/../../../../etc"} {
		if _, err := read(tr.root, bad); err == nil {
			t.Errorf("read(%q): no error", bad)
		}
	}

	// Apply completes nvidia-smi's records; the checks then tell the
	// slot-limited GPU (pass) from the degraded one (fail).
	gpus := []nvsmi.GPU{
		{Info: nvsmi.Info{UUID: "GPU-a", PCIBusID: "0000:17:00.0", PCIe: nvsmi.PCIe{WidthMax: 16, WidthCurrent: 8}}},
		{Info: nvsmi.Info{UUID: "GPU-b", PCIBusID: "0000:83:00.0", PCIe: nvsmi.PCIe{WidthMax: 16, WidthCurrent: 4}}},
		{Info: nvsmi.Info{UUID: "GPU-c", PCIBusID: "0000:00:1e.0", PCIe: nvsmi.PCIe{WidthMax: 16, WidthCurrent: 8}}},
		{Info: nvsmi.Info{UUID: "GPU-d", PCIBusID: "0000:42:00.0"}},
	}
	Apply(tr.root, gpus)
	want := map[string]nvsmi.Status{"GPU-a": nvsmi.StatusPass, "GPU-b": nvsmi.StatusFail, "GPU-c": nvsmi.StatusWarn, "GPU-d": nvsmi.StatusPass}
	for _, f := range nvsmi.CheckAll(gpus, nil) {
		if f.Check == nvsmi.CheckPCIeLink && f.Status != want[f.GPU] {
			t.Errorf("%s %s: %s %q, want %s", f.GPU, f.Check, f.Status, f.Reason, want[f.GPU])
		}
	}
}

func TestFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pcie-first.json")
	gpu := func(w int) []nvsmi.GPU {
		return []nvsmi.GPU{{Info: nvsmi.Info{UUID: "GPU-a", PCIBusID: "0000:17:00.0", PCIe: nvsmi.PCIe{WidthMax: 16, WidthCurrent: w}}}}
	}
	g := gpu(16)
	if err := First(path, "boot-1", g); err != nil || g[0].PCIe.FirstWidth != 16 {
		t.Fatalf("first reading: %v, first width %d", err, g[0].PCIe.FirstWidth)
	}
	// Later the link trains down: the first width stays, and the check
	// fails though nvidia-smi alone could not tell (no slot known).
	g = gpu(8)
	if err := First(path, "boot-1", g); err != nil || g[0].PCIe.FirstWidth != 16 {
		t.Fatalf("second reading: %v, first width %d", err, g[0].PCIe.FirstWidth)
	}
	for _, f := range nvsmi.Check(g[0], nil) {
		if f.Check == nvsmi.CheckPCIeLink && (f.Status != nvsmi.StatusFail || !strings.Contains(f.Reason, "earlier this boot")) {
			t.Errorf("pcie.link = %s %q", f.Status, f.Reason)
		}
	}
	// A new boot starts again.
	g = gpu(8)
	if err := First(path, "boot-2", g); err != nil || g[0].PCIe.FirstWidth != 8 {
		t.Fatalf("new boot: %v, first width %d", err, g[0].PCIe.FirstWidth)
	}
	// A file that does not parse is reported and replaced, and the GPUs
	// still get their widths.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	g = gpu(8)
	if err := First(path, "boot-2", g); err == nil || g[0].PCIe.FirstWidth != 8 {
		t.Fatalf("bad file: %v, first width %d", err, g[0].PCIe.FirstWidth)
	}
	if err := First(path, "boot-2", gpu(4)); err != nil {
		t.Fatalf("after the bad file was replaced: %v", err)
	}
}

// FuzzFirst: whatever the file holds, First completes the GPUs, never
// panics, and leaves a file it reads back without error.
func FuzzFirst(f *testing.F) {
	f.Add([]byte(`{"boot_id":"b","widths":{"0000:17:00.0":16}}`))
	f.Add([]byte(`{"boot_id":"b","widths":{"0000:17:00.0":-3,"../x":1e99}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "pcie-first.json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		g := []nvsmi.GPU{{Info: nvsmi.Info{PCIBusID: "0000:17:00.0", PCIe: nvsmi.PCIe{WidthCurrent: 8}}}}
		_ = First(path, "b", g)
		if g[0].PCIe.FirstWidth < 1 || g[0].PCIe.FirstWidth > 32 {
			t.Fatalf("no first width after %q", b)
		}
		if err := First(path, "b", g); err != nil {
			t.Fatalf("the file First left does not read back: %v", err)
		}
	})
}
