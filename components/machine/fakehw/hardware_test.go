package fakehw

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/xid"
)

// kernelBusID writes a GPU's address as the NVIDIA driver does in an Xid
// line: "PCI:0000:5d:00", without the function.
func kernelBusID(g nvsmi.GPU) string {
	d, _, _ := strings.Cut(g.PCIBusID, ".")
	return "PCI:" + d
}

// xidLine is a /dev/kmsg record of an Xid on g.
func xidLine(seq int, g nvsmi.GPU, code int, msg string) string {
	return fmt.Sprintf("3,%d,%d,-;NVRM: Xid (%s): %d, pid=1234, name=x, %s\n", seq, 5_000_000+seq*1000, kernelBusID(g), code, msg)
}

func appendKmsg(t *testing.T, h Hardware, lines ...string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(h.KmsgPath()), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(h.KmsgPath(), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "")); err != nil {
		t.Fatal(err)
	}
}

func xids(t *testing.T, h Hardware) []nvsmi.XID {
	t.Helper()
	x, err := h.XIDs(context.Background())
	if err != nil {
		t.Fatalf("XIDs: %v", err)
	}
	return x
}

// failing returns the indexes of the GPUs nvsmi.Check fails for x.
func failing(seed int64, x []nvsmi.XID) []int {
	var out []int
	for i, g := range GPUs(seed) {
		for _, f := range nvsmi.Check(g, x) {
			if f.Check == nvsmi.CheckXIDRecent && !f.Pass {
				out = append(out, i)
			}
		}
	}
	return out
}

// TestKmsgXIDNamesTheFakeGPU: a kmsg line naming a fake GPU's bus id, as
// the driver writes it, yields an Xid on that GPU and on no other, for
// each of the eight.
func TestKmsgXIDNamesTheFakeGPU(t *testing.T) {
	const seed = 4
	for i, g := range GPUs(seed) {
		t.Run(fmt.Sprintf("GPU %d %s", i, g.PCIBusID), func(t *testing.T) {
			h := Hardware{Seed: seed, DataDir: t.TempDir()}
			line := xidLine(1, g, 79, "GPU has fallen off the bus.")
			ev, ok := xid.Parse([]byte(line))
			if !ok || device(ev.PCIBusID) != device(g.PCIBusID) || !strings.HasPrefix(g.PCIBusID, ev.PCIBusID+".") {
				t.Fatalf("xid.Parse(%q) = %+v, %v; the GPU is at %s", line, ev, ok, g.PCIBusID)
			}
			appendKmsg(t, h, line)
			got := xids(t, h)
			want := []nvsmi.XID{{Code: 79, PCIBusID: ev.PCIBusID, Message: "GPU has fallen off the bus."}}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("XIDs = %+v, want %+v", got, want)
			}
			if f := failing(seed, got); len(f) != 1 || f[0] != i {
				t.Errorf("nvsmi.Check fails GPUs %v, want [%d]", f, i)
			}
			// The inventory's GPU has the same address.
			if inv := Machine(seed).GPUs; inv[i].UUID != g.UUID || device(inv[i].PCIBusID) != device(ev.PCIBusID) {
				t.Errorf("inventory GPU %d is %s at %s", i, inv[i].UUID, inv[i].PCIBusID)
			}
		})
	}
}

// TestKmsgXIDsPersistPerBoot: Xids read from the fake log survive a restart
// (a new Hardware over the same data dir) in the same fake boot, are read
// once, and vanish with a new boot id.
func TestKmsgXIDsPersistPerBoot(t *testing.T) {
	dir := t.TempDir()
	gpus := GPUs(1)
	h := Hardware{Seed: 1, DataDir: dir}
	if got := xids(t, h); got != nil {
		t.Fatalf("XIDs of a fresh machine = %+v", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "fakehw", bootIDFile)); !os.IsNotExist(err) {
		t.Fatalf("a fresh machine without faults made a boot id: %v", err)
	}

	appendKmsg(t, h, xidLine(1, gpus[3], 79, "GPU has fallen off the bus."))
	if got := xids(t, h); len(got) != 1 || got[0].Code != 79 {
		t.Fatalf("XIDs after a kmsg line = %+v", got)
	}
	boot, err := h.BootID()
	if err != nil {
		t.Fatal(err)
	}
	if buildinfo.FakeHW {
		if hb, err := hostinfo.BootID(dir); err != nil || hb != boot {
			t.Fatalf("hostinfo.BootID = %q, %v; fakehw's is %q", hb, err, boot)
		}
	}
	var stored struct {
		BootID string `json:"boot_id"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, xid.FaultsFile)); err != nil || json.Unmarshal(b, &stored) != nil || stored.BootID != boot {
		t.Fatalf("faults.json (%v): %s, want boot %s", err, b, boot)
	}

	restarted := Hardware{Seed: 1, DataDir: dir}
	if got := xids(t, restarted); len(got) != 1 {
		t.Fatalf("XIDs after a restart = %+v, want the one", got)
	}
	appendKmsg(t, restarted, xidLine(2, gpus[3], 48, "An uncorrectable double bit error"))
	if got := xids(t, restarted); len(got) != 2 || got[1].Code != 48 {
		t.Fatalf("XIDs after a second line = %+v", got)
	}
	if got := xids(t, restarted); len(got) != 2 {
		t.Fatalf("XIDs read again = %+v, want the same two", got)
	}

	// The fake machine reboots: a new boot id (what a fakehw agent's
	// reboot writes).
	if err := os.WriteFile(filepath.Join(dir, "fakehw", bootIDFile), []byte("0f0e0d0c-0b0a-4908-8706-050403020100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := xids(t, Hardware{Seed: 1, DataDir: dir}); len(got) != 0 {
		t.Fatalf("XIDs in a new boot = %+v, want none", got)
	}
	appendKmsg(t, h, xidLine(3, gpus[0], 31, "Ch 00000010"))
	if got := xids(t, h); len(got) != 1 || got[0].Code != 31 {
		t.Fatalf("XIDs of the new boot = %+v, want only its own", got)
	}
}

// TestKmsgLines: what is and is not read from the fake log.
func TestKmsgLines(t *testing.T) {
	g := GPUs(1)[2]
	full := xidLine(7, g, 63, "Row Remapper: New row marked for remapping")
	tests := []struct {
		name   string
		writes []string // appended one after the other, XIDs read after each
		want   []int    // the number of Xids after each write
	}{
		{name: "a line is read once its newline is written", writes: []string{full[:30], full[30 : len(full)-1], "\n"}, want: []int{0, 0, 1}},
		{name: "other kernel lines and continuations are skipped", writes: []string{
			"6,1,100,-;usb 1-1: new high-speed USB device\n SUBSYSTEM=usb\n DEVICE=c189:1\n", full, " DEVICE=+pci:0000:2a:00.0\n",
		}, want: []int{0, 1, 1}},
		{name: "dmesg lines are read too", writes: []string{"[   12.345678] NVRM: Xid (PCI:0000:2a:00): 13, Graphics Exception\n"}, want: []int{1}},
		{name: "an Xid naming no GPU the kernel way still counts", writes: []string{"4,9,9,-;NVRM: Xid (GPU 3): 79, fallen\n"}, want: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := Hardware{Seed: 1, DataDir: t.TempDir()}
			for i, w := range tt.writes {
				appendKmsg(t, h, w)
				if got := xids(t, h); len(got) != tt.want[i] {
					t.Fatalf("after write %d (%q): XIDs = %+v, want %d", i, w, got, tt.want[i])
				}
			}
		})
	}
}

// TestKmsgTruncated: a log truncated below the position read is read from
// its start again.
func TestKmsgTruncated(t *testing.T) {
	gpus := GPUs(1)
	h := Hardware{Seed: 1, DataDir: t.TempDir()}
	appendKmsg(t, h, xidLine(1, gpus[0], 79, "a"), xidLine(2, gpus[1], 79, "b"), xidLine(3, gpus[2], 79, "c"))
	if got := xids(t, h); len(got) != 3 {
		t.Fatalf("XIDs = %+v", got)
	}
	if err := os.WriteFile(h.KmsgPath(), []byte(xidLine(9, gpus[4], 74, "NVLink")), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := xids(t, h); len(got) != 4 || got[3].Code != 74 {
		t.Fatalf("XIDs after the log was truncated = %+v", got)
	}
}

// TestResetGPUClearsItsXIDs: a reset clears the GPU's Xids from the store
// (those read before and those still in the log) and from xids.json, and
// leaves the other GPUs' alone; a later Xid shows again.
func TestResetGPUClearsItsXIDs(t *testing.T) {
	const seed = 2
	gpus := GPUs(seed)
	h := Hardware{Seed: seed, DataDir: t.TempDir()}
	appendKmsg(t, h, xidLine(1, gpus[3], 79, "GPU has fallen off the bus."), xidLine(2, gpus[5], 48, "DBE"))
	if got := failing(seed, xids(t, h)); fmt.Sprint(got) != "[3 5]" {
		t.Fatalf("failing GPUs %v", got)
	}
	legacy, _ := json.Marshal([]nvsmi.XID{{Code: 13, UUID: gpus[3].UUID}, {Code: 13, UUID: gpus[6].UUID}})
	if err := os.WriteFile(filepath.Join(h.dir(), xidsFile), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	appendKmsg(t, h, xidLine(3, gpus[3], 31, "not read before the reset"))
	if got := failing(seed, xids(t, h)); fmt.Sprint(got) != "[3 5 6]" {
		t.Fatalf("failing GPUs with xids.json %v", got)
	}
	appendKmsg(t, h, xidLine(4, gpus[3], 45, "logged before the reset, read by it"))

	if err := h.ResetGPU(context.Background(), gpus[3]); err != nil {
		t.Fatal(err)
	}
	got := xids(t, h)
	if f := failing(seed, got); fmt.Sprint(f) != "[5 6]" {
		t.Fatalf("after resetting GPU 3: failing GPUs %v (%+v)", f, got)
	}
	if restarted := xids(t, Hardware{Seed: seed, DataDir: h.DataDir}); fmt.Sprint(failing(seed, restarted)) != "[5 6]" {
		t.Fatalf("after a restart the reset GPU's Xids came back: %+v", restarted)
	}
	b, err := os.ReadFile(filepath.Join(h.dir(), "gpu-resets.log"))
	if err != nil || !strings.HasPrefix(string(b), gpus[3].UUID+" "+gpus[3].PCIBusID+" ") {
		t.Fatalf("gpu-resets.log: %q %v", b, err)
	}

	appendKmsg(t, h, xidLine(5, gpus[3], 79, "after the reset"))
	if f := failing(seed, xids(t, h)); fmt.Sprint(f) != "[3 5 6]" {
		t.Fatalf("an Xid after the reset: failing GPUs %v", f)
	}
}

// TestXIDsOneSourceFails: a malformed xids.json is an error, and the
// kernel log's Xids are still returned with it.
func TestXIDsOneSourceFails(t *testing.T) {
	h := Hardware{Seed: 1, DataDir: t.TempDir()}
	appendKmsg(t, h, xidLine(1, GPUs(1)[0], 79, "fallen"))
	if err := os.WriteFile(filepath.Join(h.dir(), xidsFile), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := h.XIDs(context.Background())
	if err == nil || !strings.Contains(err.Error(), "xids.json") || len(got) != 1 || got[0].Code != 79 {
		t.Fatalf("XIDs = %+v, %v; want the kmsg Xid and an error naming xids.json", got, err)
	}
}
