package report

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

type fakeInv struct {
	mu     sync.Mutex
	secs   map[string]json.RawMessage
	hashes map[string]string
}

func (f *fakeInv) get() (map[string]json.RawMessage, map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.secs, f.hashes
}

func (f *fakeInv) set(name, body, hash string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	secs := map[string]json.RawMessage{}
	hashes := map[string]string{}
	for k, v := range f.secs {
		secs[k], hashes[k] = v, f.hashes[k]
	}
	secs[name], hashes[name] = json.RawMessage(body), hash
	f.secs, f.hashes = secs, hashes
}

func inventoryOf(t *testing.T, r *bcdv1.StatusReport) map[string]json.RawMessage {
	t.Helper()
	m := map[string]json.RawMessage{}
	if len(r.GetInventory()) > 0 {
		if err := json.Unmarshal(r.GetInventory(), &m); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// TestInventoryInReports: Welcome's requested sections go out in full,
// then only sections whose hash changed.
func TestInventoryInReports(t *testing.T) {
	inv := &fakeInv{}
	inv.set("cpu", `{"cores":8}`, "sha256:c1")
	inv.set("gpus", `[1]`, "sha256:g1")
	var got []*bcdv1.StatusReport
	r := New(Config{Machine: Machine{Inventory: inv.get}, Publish: func(x *bcdv1.StatusReport) { got = append(got, x) },
		Status: func() converge.Status { return converge.Status{Applied: 3, Observed: 2} }})
	r.Welcome(&bcdv1.Welcome{RequestedSections: []string{"*"}})
	if len(got) != 1 || len(inventoryOf(t, got[0])) != 2 || got[0].GetAppliedGeneration() != 3 || got[0].GetObservedGeneration() != 2 {
		t.Fatalf("first report %v", got)
	}
	if m := inventoryOf(t, r.Build()); len(m) != 0 {
		t.Errorf("an unchanged inventory was sent again: %v", m)
	}
	inv.set("gpus", `[2]`, "sha256:g2")
	if m := inventoryOf(t, r.Build()); len(m) != 1 || string(m["gpus"]) != `[2]` {
		t.Errorf("changed section: %v", m)
	}
	// A new session asking for one section gets it, and only it.
	r.Welcome(&bcdv1.Welcome{RequestedSections: []string{"cpu"}})
	if m := inventoryOf(t, got[len(got)-1]); len(m) != 1 || m["cpu"] == nil {
		t.Errorf("requested section: %v", m)
	}
	if h := got[len(got)-1].GetInventoryHashes(); h["gpus"] != "sha256:g2" || h["cpu"] != "sha256:c1" {
		t.Errorf("hashes %v", h)
	}
}

// TestHeartbeatHashes: every 10th beat and the first after a change.
func TestHeartbeatHashes(t *testing.T) {
	inv := &fakeInv{}
	inv.set("cpu", `{}`, "sha256:c1")
	r := New(Config{Machine: Machine{Inventory: inv.get}, Status: func() converge.Status { return converge.Status{Applied: 5, Observed: 5} }})
	var with []int
	for beat := 0; beat < 25; beat++ {
		if beat == 13 {
			inv.set("cpu", `{"x":1}`, "sha256:c2")
		}
		hb := &bcdv1.Heartbeat{}
		r.Heartbeat(hb, beat)
		if hb.GetObservedGeneration() != 5 || hb.GetAppliedGeneration() != 5 {
			t.Fatalf("beat %d: generations %v", beat, hb)
		}
		if len(hb.GetInventoryHashes()) > 0 {
			with = append(with, beat)
		}
	}
	want := []int{0, 10, 13, 20}
	if len(with) != len(want) {
		t.Fatalf("hashes on beats %v, want %v", with, want)
	}
	for i := range want {
		if with[i] != want[i] {
			t.Fatalf("hashes on beats %v, want %v", with, want)
		}
	}
}

// TestCoalesced: many changes in one interval make one report.
func TestCoalesced(t *testing.T) {
	var mu sync.Mutex
	n := 0
	r := New(Config{MinInterval: 200 * time.Millisecond, Publish: func(*bcdv1.StatusReport) { mu.Lock(); n++; mu.Unlock() }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	r.publish() // a report just went out
	for i := 0; i < 50; i++ {
		r.Changed()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(400 * time.Millisecond)
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if n != 2 {
		t.Errorf("%d reports for 50 changes in one interval (after one sent), want 2", n)
	}
}

func TestSectionsAndMachine(t *testing.T) {
	r := New(Config{Machine: Machine{
		Conditions: func() []*bcdv1.Condition { return []*bcdv1.Condition{{Type: "Xid", Subject: "GPU-1"}} },
		Pressure:   func() *bcdv1.Pressure { return &bcdv1.Pressure{Available: true, CpuSomeAvg10: 1.5} },
	}})
	r.SetSections([]byte(`{"images":[]}`))
	rep := r.Build()
	if string(rep.GetSections()) != `{"images":[]}` || len(rep.GetConditions()) != 1 || rep.GetPressure().GetCpuSomeAvg10() != 1.5 || rep.GetAtUnixMs() == 0 {
		t.Errorf("report %v", rep)
	}
}
