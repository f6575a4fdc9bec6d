package devices

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/machine/inventory"
)

func testMachine(n int) func(context.Context) (*inventory.Inventory, error) {
	return func(context.Context) (*inventory.Inventory, error) {
		inv := &inventory.Inventory{CPU: inventory.CPU{Threads: 16}, Memory: inventory.Memory{TotalBytes: 1 << 30}}
		for i := range n {
			m := i
			inv.GPUs = append(inv.GPUs, inventory.GPU{UUID: "GPU-0000000" + string(rune('0'+i)) + "-aaaa-bbbb-cccc-dddddddddddd", Minor: &m})
		}
		return inv, nil
	}
}

type recorded struct{ typ, alloc string }

func section(t *testing.T, files Files, unhealthy string) (*Section, *[]recorded) {
	var evs []recorded
	var sl Slices
	if files != nil {
		sl = testSlices(t, nil)
	}
	s := New(Config{Inventory: testMachine(4), Files: files, Slices: sl,
		Unhealthy: func(u string) (bool, string) { return u == unhealthy, "Xid 79 this boot: GPU has fallen off the bus" },
		Event: func(typ string, body any) {
			evs = append(evs, recorded{typ, body.(map[string]any)["allocation"].(string)})
		}})
	return s, &evs
}

func run(t *testing.T, s *Section, body string) error {
	t.Helper()
	ctx := context.Background()
	p, err := s.Plan(ctx, json.RawMessage(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Changes) == 0 {
		return nil
	}
	return s.Apply(ctx, json.RawMessage(body), p)
}

func TestAdmission(t *testing.T) {
	files := DirFiles{Root: t.TempDir()}
	inv, _ := testMachine(4)(context.Background())
	bad := inv.GPUs[3].UUID
	s, evs := section(t, files, bad)
	err := run(t, s, `{"holds":[
		{"allocation":"a","gpus":["0","1"]},
		{"allocation":"b","gpus":["1"]},
		{"allocation":"c","gpus":["7"]},
		{"allocation":"d","gpus":["2"],"limits":{"memory_bytes":2147483648}},
		{"allocation":"e","gpus":["3"]},
		{"allocation":"f","gpus":["2"],"limits":{"cpus":"0-3"}}]}`)
	if err == nil || !converge.IsTerminal(err) {
		t.Fatalf("Apply = %v, want a terminal failure for the failed holds", err)
	}
	for _, want := range []string{"b: resources-exhausted: GPU", "held by a", "c: GPU 7 is not on this host", "d: resources-exhausted: memory", "e: GPU " + bad + " is UNHEALTHY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
	ids, _ := files.List("cdi")
	if strings.Join(ids, " ") != "a f" {
		t.Errorf("specs for %v, want a and f", ids)
	}
	spec, _ := files.Read("cdi", "a")
	if err := cdispec.Check("a", spec, func(p string) bool { return p == "/dev/nvidia0" || p == "/dev/nvidia1" }); err != nil {
		t.Errorf("a's spec: %v", err)
	}
	if s.HeldBy(inv.GPUs[0].UUID) != "a" || s.HeldBy(inv.GPUs[2].UUID) != "f" || s.HeldBy(bad) != "" {
		t.Error("HeldBy")
	}
	n := map[string]int{}
	for _, e := range *evs {
		n[e.typ]++
	}
	if n["AllocationBound"] != 2 || n["AllocationFailed"] != 4 {
		t.Errorf("events %v", *evs)
	}
	// The same spec again: nothing rewritten, no event again.
	st, _ := os.Stat(filepath.Join(files.Root, "etc/cdi/bcd-a.json"))
	*evs = nil
	run(t, s, `{"holds":[{"allocation":"a","gpus":["0","1"]},{"allocation":"f","gpus":["2"],"limits":{"cpus":"0-3"}}]}`)
	st2, _ := os.Stat(filepath.Join(files.Root, "etc/cdi/bcd-a.json"))
	if !st.ModTime().Equal(st2.ModTime()) || len(*evs) != 0 {
		t.Errorf("an unchanged hold was rewritten or reported: %v", *evs)
	}
	// Releasing f removes its files.
	run(t, s, `{"holds":[{"allocation":"a","gpus":["0","1"]}]}`)
	if ids, _ := files.List("allocation-env"); strings.Join(ids, " ") != "a" {
		t.Errorf("env files %v after releasing f", ids)
	}
}

func TestUnprivilegedFailsEveryHold(t *testing.T) {
	s, _ := section(t, nil, "")
	err := run(t, s, `{"holds":[{"allocation":"a","gpus":["0"]},{"allocation":"b","gpus":["1"]}]}`)
	if err == nil || strings.Count(err.Error(), "node-unprivileged") != 2 {
		t.Errorf("%v", err)
	}
}

func TestCheckRefuses(t *testing.T) {
	s, _ := section(t, nil, "")
	for body, want := range map[string]string{
		`{"holds":[{"allocation":"a b","gpus":["0"]}]}`:                               "allocation",
		`{"holds":[{"allocation":"a","gpus":[]}]}`:                                    "1 to 64 GPUs",
		`{"holds":[{"allocation":"a","gpus":["0"]},{"allocation":"a","gpus":["1"]}]}`: "named twice",
		`{"holds":[{"allocation":"a","gpus":["0"],"limits":{"cpus":"x"}}]}`:           "limits.cpus",
		`{"holds":[{"allocation":"a","gpus":["0"],"mode":"exclusive"}]}`:              "unknown field",
	} {
		if err := s.Check(json.RawMessage(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%s) = %v, want %q", body, err, want)
		}
	}
}
