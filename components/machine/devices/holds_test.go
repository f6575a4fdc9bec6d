package devices

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/inventory"
)

// testSlices keeps slices under a directory of the test's, with a
// systemctl that records its calls.
func testSlices(t *testing.T, calls *[]string) DirSlices {
	root := t.TempDir()
	return DirSlices{Root: root, Cgroup: filepath.Join(root, "cgroup"), Systemctl: func(_ context.Context, args ...string) error {
		if calls != nil {
			*calls = append(*calls, strings.Join(args, " "))
		}
		return nil
	}}
}

// fakeNode is the devices section on the fake HGX machine with GPUs 6 and
// 7 in MIG mode.
func fakeNode(t *testing.T) (*Section, DirFiles, DirSlices, *[]string, int64) {
	seed := fakehw.MIGSeed(3, 6, 7)
	files := DirFiles{Root: t.TempDir()}
	var calls []string
	sl := testSlices(t, &calls)
	s := New(Config{
		Inventory: func(context.Context) (*inventory.Inventory, error) { return fakehw.Machine(seed), nil },
		MIGCaps:   func() (cdispec.MIGCaps, error) { return cdispec.ParseMIGCaps(fakehw.MIGCaps()) },
		Files:     files, Slices: sl,
		InVM: func(uuid string) string {
			if uuid == fakehw.GPUUUID(seed, 5) {
				return "vm-1"
			}
			return ""
		},
	})
	return s, files, sl, &calls, seed
}

func reasons(err error) map[string]string {
	out := map[string]string{}
	if err == nil {
		return out
	}
	_, list, _ := strings.Cut(err.Error(), ": ")
	for _, part := range strings.Split(list, "; ") {
		id, why, _ := strings.Cut(part, ": ")
		out[id] = why
	}
	return out
}

// TestMIGAndSlotHolds: MIG instances by UUID and by GPU instance, slots
// of a shared GPU, and the parent-aware conflicts: each failed hold fails
// alone with its reason and the others converge.
func TestMIGAndSlotHolds(t *testing.T) {
	s, files, _, _, seed := fakeNode(t)
	mig := fakehw.MIGUUID(seed, 7, 0) // gi2/ci0 of GPU 7
	body := `{"sharing":{"mode":"mps","slots":4},"holds":[
		{"allocation":"m1","gpus":["` + mig + `"]},
		{"allocation":"m2","gpus":["7/gi3/ci0"]},
		{"allocation":"whole7","gpus":["7"]},
		{"allocation":"m1again","gpus":["7/gi2/ci0"]},
		{"allocation":"whole6","gpus":["6"]},
		{"allocation":"m6","gpus":["6/gi9/ci0"]},
		{"allocation":"s0","gpus":["2/slot0"]},
		{"allocation":"s1","gpus":["2/slot1","2/slot2"]},
		{"allocation":"s0again","gpus":["2/slot0"]},
		{"allocation":"whole2","gpus":["2"]},
		{"allocation":"slot9","gpus":["3/slot9"]},
		{"allocation":"slotmig","gpus":["6/slot0"]},
		{"allocation":"nomig","gpus":["1/gi2/ci0"]},
		{"allocation":"absent","gpus":["MIG-00000000-0000-4000-8000-000000000000"]},
		{"allocation":"vm","gpus":["5"]},
		{"allocation":"big","gpus":["4"],"limits":{"cpus":"0-300"}},
		{"allocation":"ok0","gpus":["0"]}]}`
	err := run(t, s, body)
	got := reasons(err)
	want := map[string]string{
		"whole7":  "resources-exhausted: GPU " + fakehw.GPUUUID(seed, 7) + " is held by m1",
		"m1again": "resources-exhausted: MIG instance gi2/ci0",
		"m6":      "resources-exhausted: MIG instance gi9/ci0",
		"s0again": "resources-exhausted: slot 0 of GPU",
		"whole2":  "resources-exhausted: GPU " + fakehw.GPUUUID(seed, 2) + " is held by s0",
		"slot9":   "resources-exhausted: 3/slot9: a GPU has 4 slots",
		"slotmig": "is in MIG mode: hold its MIG instances, not slots",
		"nomig":   "is not in MIG mode",
		"absent":  "is not on this host",
		"vm":      "passed through to instance vm-1",
		"big":     "resources-exhausted: CPU 224 is beyond",
	}
	if len(got) != len(want) {
		t.Errorf("failed holds %v, want %d", got, len(want))
	}
	for id, w := range want {
		if !strings.Contains(got[id], w) {
			t.Errorf("%s failed with %q, want %q", id, got[id], w)
		}
	}
	ids, _ := files.List("cdi")
	if strings.Join(ids, " ") != "m1 m2 ok0 s0 s1 whole6" {
		t.Errorf("specs for %v", ids)
	}
	// m1's spec: GPU 7's node and the capability nodes of gi2 and ci0,
	// as the helper would allow them.
	caps, _ := cdispec.ParseMIGCaps(fakehw.MIGCaps())
	spec, _ := files.Read("cdi", "m1")
	nodes, _ := caps.Nodes(7, 2, 0)
	for _, n := range append(nodes, "/dev/nvidia7", "NVIDIA_VISIBLE_DEVICES="+mig) {
		if !strings.Contains(string(spec), n) {
			t.Errorf("m1's spec lacks %s:\n%s", n, spec)
		}
	}
	allowed := append(caps.Allowed([]int{6, 7}), "/dev/nvidia6", "/dev/nvidia7", "/dev/nvidia2", "/dev/nvidia0")
	for _, id := range ids {
		spec, _ := files.Read("cdi", id)
		if err := cdispec.Check(id, spec, func(p string) bool { return slices.Contains(allowed, p) }); err != nil {
			t.Errorf("%s's spec would be refused by the helper: %v", id, err)
		}
	}
	// The whole of GPU 6 (in MIG mode) is its three instances.
	spec, _ = files.Read("cdi", "whole6")
	if n := strings.Count(string(spec), "nvidia-caps/"); n != 6 {
		t.Errorf("%d capability nodes", n)
		t.Errorf("whole6's spec does not give the 3 instances' capabilities:\n%s", spec)
	}
	env, _ := files.Read("allocation-env", "s1")
	if !strings.Contains(string(env), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\n") {
		t.Errorf("s1 (2 of 4 MPS slots) env:\n%s", env)
	}
	if h := s.HeldBy(fakehw.GPUUUID(seed, 7)); h != "m1 (MIG gi2/ci0), m2 (MIG gi3/ci0)" {
		t.Errorf("HeldBy(GPU 7) = %q", h)
	}
	if h := s.HeldBy(fakehw.GPUUUID(seed, 2)); h != "s0 (slot 0), s1 (slot 1), s1 (slot 2)" {
		t.Errorf("HeldBy(GPU 2) = %q", h)
	}
}

// TestBoundHoldsFirst: a hold added before a running one in the spec does
// not displace it; it fails, and the running hold's files are untouched.
func TestBoundHoldsFirst(t *testing.T) {
	s, files, _, _, _ := fakeNode(t)
	if err := run(t, s, `{"holds":[{"allocation":"old","gpus":["3"]}]}`); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(filepath.Join(files.Root, "etc/cdi/bcd-old.json"))
	err := run(t, s, `{"holds":[{"allocation":"new","gpus":["3"]},{"allocation":"old","gpus":["3"]}]}`)
	if r := reasons(err); len(r) != 1 || !strings.Contains(r["new"], "held by old") {
		t.Errorf("failed %v", r)
	}
	after, _ := os.Stat(filepath.Join(files.Root, "etc/cdi/bcd-old.json"))
	if !os.SameFile(before, after) || !before.ModTime().Equal(after.ModTime()) {
		t.Error("the running hold's spec was rewritten")
	}
}

// TestSlices: a hold with limits gets its slice drop-in (read back to
// tell it is there), changed limits rewrite it, a restart with the same
// spec touches nothing, a released hold's slice goes, and a populated
// slice is left alone.
func TestSlices(t *testing.T) {
	s, _, sl, calls, _ := fakeNode(t)
	body := `{"holds":[{"allocation":"a1","gpus":["0"],"limits":{"cpus":"0-3","memory_bytes":1073741824}}]}`
	if err := run(t, s, body); err != nil {
		t.Fatal(err)
	}
	dropin := filepath.Join(sl.Root, "run/systemd/system/bcd-alloc-a1.slice.d/50-bcd.conf")
	b, err := os.ReadFile(dropin)
	if err != nil || !strings.Contains(string(b), "AllowedCPUs=0-3\n") || !strings.Contains(string(b), "MemoryMax=1073741824\n") {
		t.Fatalf("drop-in %q, %v", b, err)
	}
	if strings.Join(*calls, "; ") != "daemon-reload; start bcd-alloc-a1.slice" {
		t.Errorf("systemctl %v", *calls)
	}
	// Restart: a new section over the same files and slices.
	s2, _, _, _, _ := fakeNode(t)
	s2.cfg.Files, s2.cfg.Slices = s.cfg.Files, s.cfg.Slices
	*calls = nil
	p, err := s2.Plan(context.Background(), json.RawMessage(body))
	if err != nil || len(p.Changes) != 0 || len(*calls) != 0 {
		t.Errorf("after a restart: changes %v, systemctl %v, %v", p.Changes, *calls, err)
	}
	// New limits rewrite the drop-in.
	if err := run(t, s, strings.Replace(body, "0-3", "4-7", 1)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dropin); !strings.Contains(string(b), "AllowedCPUs=4-7\n") {
		t.Errorf("drop-in after new limits %q", b)
	}
	// A populated slice is not stopped; once empty it goes.
	cg := filepath.Join(sl.Cgroup, wire.SliceCgroup("bcd-alloc-a1.slice"))
	os.MkdirAll(cg, 0o755)
	os.WriteFile(filepath.Join(cg, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644)
	*calls = nil
	if err := run(t, s, `{"holds":[]}`); err == nil || !strings.Contains(err.Error(), "still has processes") {
		t.Errorf("releasing a populated slice: %v", err)
	}
	if slices.Contains(*calls, "stop bcd-alloc-a1.slice") {
		t.Error("a slice with processes was stopped")
	}
	os.WriteFile(filepath.Join(cg, "cgroup.events"), []byte("populated 0\nfrozen 0\n"), 0o644)
	if err := run(t, s, `{"holds":[]}`); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dropin); !os.IsNotExist(err) {
		t.Errorf("drop-in still there: %v", err)
	}
	// No systemd: limits fail the hold, naming why.
	s.cfg.Slices = nil
	if r := reasons(run(t, s, body)); !strings.Contains(r["a1"], "no systemd") {
		t.Errorf("without systemd: %v", r)
	}
}

func TestParseRef(t *testing.T) {
	for in, want := range map[string]Ref{
		"3":                  {GPU: "3", GI: -1, CI: -1, Slot: -1},
		"GPU-12345678-aaaa":  {GPU: "GPU-12345678-aaaa", GI: -1, CI: -1, Slot: -1},
		"MIG-12345678-aaaa":  {MIG: "MIG-12345678-aaaa", GI: -1, CI: -1, Slot: -1},
		"3/gi2/ci0":          {GPU: "3", GI: 2, CI: 0, Slot: -1},
		"GPU-12345678/slot3": {GPU: "GPU-12345678", GI: -1, CI: -1, Slot: 3},
	} {
		if got, err := ParseRef(in); err != nil || got != want {
			t.Errorf("ParseRef(%q) = %+v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "03", "-1", "1000", "3/gi15/ci0", "3/gi2/ci8", "3/slot64", "3/slot", "MIG-12345678/gi1/ci0",
		"GPU-xyz", "3/gi2", "3/gi2/ci0/x", "../3", "3/slot01"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) gave no error", bad)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{"3", "GPU-12345678", "MIG-12345678", "3/gi2/ci0", "3/slot1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		if (r.GPU == "") == (r.MIG == "") || r.GI >= 15 || r.CI >= 8 || r.Slot >= 64 || strings.ContainsAny(r.GPU+r.MIG, "/\n ") {
			t.Fatalf("ParseRef(%q) = %+v", s, r)
		}
	})
}
