package health

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/pressure"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// fakeHW is a machine whose inventory and XIDs the test sets, counting
// the monitor's reads.
type fakeHW struct {
	mu     sync.Mutex
	inv    *inventory.Inventory
	invErr error
	xids   []nvsmi.XID
	xidErr error
	invAt  []time.Time // when each collection happened
	polls  int
}

func newFakeHW() *fakeHW { return &fakeHW{inv: fakehw.Machine(1)} }

func (f *fakeHW) Inventory(context.Context) (*inventory.Inventory, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.invAt = append(f.invAt, time.Now())
	if f.invErr != nil {
		return nil, f.invErr
	}
	return f.inv, nil
}

func (f *fakeHW) XIDs(context.Context) ([]nvsmi.XID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	return slices.Clone(f.xids), f.xidErr
}

func (f *fakeHW) SMI() nvsmi.Runner                         { return nil }
func (f *fakeHW) ResetGPU(context.Context, nvsmi.GPU) error { return nil }

func (f *fakeHW) set(fn func(f *fakeHW)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeHW) collections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.invAt)
}

func (f *fakeHW) pollCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polls
}

// counting wraps a Hardware (fakehw's) to count the monitor's reads.
type counting struct {
	nodekinds.Hardware
	invs, polls atomic.Int64
}

func (c *counting) Inventory(ctx context.Context) (*inventory.Inventory, error) {
	c.invs.Add(1)
	return c.Hardware.Inventory(ctx)
}

func (c *counting) XIDs(ctx context.Context) ([]nvsmi.XID, error) {
	c.polls.Add(1)
	return c.Hardware.XIDs(ctx)
}

// running is a Monitor whose Run goroutine the test owns.
type running struct {
	*Monitor
	changed atomic.Int64
	mu      sync.Mutex
	atCall  []*bcdv1.Pressure // the pressure at each changed() call
	cancel  context.CancelFunc
	done    chan error
	once    sync.Once
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Monitor: New(cfg), cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- r.Run(ctx, func() {
			r.changed.Add(1)
			r.mu.Lock()
			r.atCall = append(r.atCall, r.Pressure())
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends Run and checks it returned nil, within a few seconds.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// waitFor polls cond until it holds, failing after a few seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestMonitorXIDBurst: Xids become conditions and call changed; a burst of
// them, read over several polls, causes exactly one extra inventory
// collection, BurstDelay after the first.
func TestMonitorXIDBurst(t *testing.T) {
	const burstDelay = 400 * time.Millisecond
	hw := newFakeHW()
	r := start(t, Config{HW: hw, XIDPoll: 5 * time.Millisecond, BurstDelay: burstDelay, InventoryEvery: time.Hour})
	waitFor(t, "the first collection", func() bool { s, h := r.Inventory(); return s != nil && h != nil })
	waitFor(t, "changed for the first inventory", func() bool { return r.changed.Load() >= 1 })
	if n := hw.collections(); n != 1 {
		t.Fatalf("%d collections at start, want 1", n)
	}
	if c := r.Conditions(); len(c) != 0 {
		t.Fatalf("conditions before any Xid: %v", c)
	}
	before := r.changed.Load()

	gpu3, gpu5 := fakehw.GPUs(1)[3], fakehw.GPUs(1)[5]
	bus := func(g nvsmi.GPU) string { d, _, _ := strings.Cut(g.PCIBusID, "."); return d }
	burst := []nvsmi.XID{
		{Code: 79, PCIBusID: bus(gpu3), Message: "GPU has fallen off the bus."},
		{Code: 48, PCIBusID: bus(gpu5), Message: "DBE"},
		{Code: 45, PCIBusID: bus(gpu3), Message: "Preemptive cleanup"},
	}
	t0 := time.Now()
	for i := range burst {
		polls := hw.pollCount()
		hw.set(func(f *fakeHW) { f.xids = append(f.xids, burst[i]) })
		waitFor(t, "a poll to read the Xid", func() bool { return hw.pollCount() >= polls+2 })
	}
	if n := hw.collections(); n != 1 {
		t.Fatalf("%d collections while the burst was read (in %v, BurstDelay %v), want 1", n, time.Since(t0), burstDelay)
	}
	conds := r.Conditions()
	if len(conds) != 2 || conds[0].Subject > conds[1].Subject {
		t.Fatalf("conditions %v", conds)
	}
	for _, c := range conds {
		switch c.Subject {
		case gpu3.UUID:
			if c.Type != "Xid" || c.Reason != "Xid 45" || !strings.HasPrefix(c.Message, "Preemptive cleanup (") || c.Count != 2 || c.SinceUnixMs < t0.UnixMilli()-1 {
				t.Errorf("GPU 3's condition %v", c)
			}
		case gpu5.UUID:
			if c.Reason != "Xid 48" || c.Count != 1 {
				t.Errorf("GPU 5's condition %v", c)
			}
		default:
			t.Errorf("a condition on %s", c.Subject)
		}
	}
	if r.changed.Load() < before+3 {
		t.Errorf("changed called %d times for three Xids, want at least 3", r.changed.Load()-before)
	}

	waitFor(t, "the burst's collection", func() bool { return hw.collections() == 2 })
	hw.mu.Lock()
	at := hw.invAt[1]
	hw.mu.Unlock()
	if d := at.Sub(t0); d < burstDelay {
		t.Errorf("the burst's collection came %v after the first Xid, before BurstDelay %v", d, burstDelay)
	}
	// No other collection for longer than BurstDelay.
	polls := hw.pollCount()
	waitFor(t, "polls past BurstDelay", func() bool {
		return hw.pollCount() > polls+10 && time.Since(at) > burstDelay+100*time.Millisecond
	})
	if n := hw.collections(); n != 2 {
		t.Fatalf("%d collections after one burst, want 2", n)
	}
	since := conds[0].SinceUnixMs
	if c := r.Conditions(); c[0].SinceUnixMs != since {
		t.Errorf("since moved from %d to %d across polls", since, c[0].SinceUnixMs)
	}

	// A later Xid is a burst of its own; an Xid no longer reported clears.
	hw.set(func(f *fakeHW) { f.xids = f.xids[1:2] })
	waitFor(t, "GPU 3's condition to clear", func() bool { return len(r.Conditions()) == 1 })
	if n := hw.collections(); n != 2 {
		t.Errorf("Xids going away caused a collection (%d)", n)
	}
	hw.set(func(f *fakeHW) { f.xids = append(f.xids, nvsmi.XID{Code: 31, PCIBusID: bus(gpu3)}) })
	waitFor(t, "the next burst's collection", func() bool { return hw.collections() == 3 })
	if c := r.Conditions(); len(c) != 2 {
		t.Errorf("conditions %v", c)
	}
}

// TestMonitorInventoryHashes: changed is called when a section hash
// changes, and not for a collection that changed nothing hashed.
func TestMonitorInventoryHashes(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(inv *inventory.Inventory)
		changes []string // the sections whose hash changes
	}{
		{name: "the same machine again", mutate: func(*inventory.Inventory) {}},
		{name: "only live samples move", mutate: func(inv *inventory.Inventory) {
			inv.Live.GPUs[0].Sample.TemperatureC += 20
			inv.Live.GPUs[1].Sample.PowerDrawW = 650
		}},
		{name: "a BIOS update", mutate: func(inv *inventory.Inventory) { inv.System.BIOSVersion = "2.2" }, changes: []string{"system"}},
		{name: "a GPU fell off the bus", mutate: func(inv *inventory.Inventory) { inv.GPUs = inv.GPUs[1:] }, changes: []string{"gpus"}},
		{name: "memory and a NIC", mutate: func(inv *inventory.Inventory) {
			inv.Memory.HugePages1G = 64
			inv.NICs[0].SpeedMbps = 0
		}, changes: []string{"memory", "nics"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hw := newFakeHW()
			r := start(t, Config{HW: hw, XIDPoll: time.Hour, InventoryEvery: 10 * time.Millisecond})
			waitFor(t, "two collections", func() bool { return hw.collections() >= 2 })
			_, first := r.Inventory()
			if !maps.Equal(first, fakehw.Machine(1).SectionHashes) {
				t.Fatalf("hashes %v, want the sealed machine's %v", first, fakehw.Machine(1).SectionHashes)
			}
			if n := r.changed.Load(); n != 1 {
				t.Fatalf("changed called %d times for the same machine collected again, want 1 (the first)", n)
			}
			inv := fakehw.Machine(1)
			tt.mutate(inv)
			n := hw.collections()
			hw.set(func(f *fakeHW) { f.inv = inv })
			waitFor(t, "three more collections", func() bool { return hw.collections() >= n+3 })

			secs, hashes := r.Inventory()
			var changed []string
			for name, h := range hashes {
				if h != first[name] {
					changed = append(changed, name)
				}
				if inventory.HashBytes(secs[name]) != h {
					t.Errorf("section %s does not hash to %s", name, h)
				}
			}
			slices.Sort(changed)
			if !slices.Equal(changed, tt.changes) {
				t.Errorf("changed sections %v, want %v", changed, tt.changes)
			}
			if want := map[bool]int64{false: 1, true: 2}[len(tt.changes) > 0]; r.changed.Load() != want {
				t.Errorf("changed called %d times, want %d", r.changed.Load(), want)
			}
			if !maps.EqualFunc(secs, inv.Sections(), func(a json.RawMessage, b []byte) bool { return bytes.Equal(a, b) }) {
				t.Errorf("sections are not the last inventory's")
			}
		})
	}
}

// TestFakeMachineHashesStable: the fake machine's sections hash the same
// at every collection (its live GPU samples are outside every hash).
func TestFakeMachineHashesStable(t *testing.T) {
	hw := &counting{Hardware: fakehw.Hardware{Seed: 9, DataDir: t.TempDir()}}
	r := start(t, Config{HW: hw, XIDPoll: time.Hour, InventoryEvery: 5 * time.Millisecond})
	waitFor(t, "ten collections", func() bool { return hw.invs.Load() >= 10 })
	if n := r.changed.Load(); n != 1 {
		t.Errorf("changed called %d times over %d collections of the fake machine, want 1", n, hw.invs.Load())
	}
}

// TestMonitorPressure: pressure is sampled at start and every
// PressureEvery; changed is called when its values move, not for a new
// timestamp alone.
func TestMonitorPressure(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".tmp", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
	psi := func(some, full float64) string {
		return fmt.Sprintf("some avg10=%.2f avg60=1.00 avg300=0.00 total=1\nfull avg10=%.2f avg60=0.00 avg300=0.00 total=1\n", some, full)
	}
	write("pressure/cpu", psi(3, 0))
	write("pressure/memory", psi(4, 2))
	write("pressure/io", psi(5, 1))
	write("stat", "cpu 100 0 0 0 0 0 0 0 0 0\n")

	var clock atomic.Int64
	clock.Store(1_700_000_000_000)
	now := func() time.Time { return time.UnixMilli(clock.Add(1)) }
	hw := newFakeHW()
	r := start(t, Config{HW: hw, Pressure: pressure.New(root), XIDPoll: time.Hour, InventoryEvery: time.Hour,
		PressureEvery: 5 * time.Millisecond, Now: now})
	waitFor(t, "a sample", func() bool { return r.Pressure() != nil })
	p := r.Pressure()
	if !p.GetAvailable() || p.GetCpuSomeAvg10() != 3 || p.GetCpuSomeAvg60() != 1 || p.GetMemorySomeAvg10() != 4 || p.GetMemoryFullAvg10() != 2 ||
		p.GetIoSomeAvg10() != 5 || p.GetIoFullAvg10() != 1 || p.GetCpuStealPercent() != 0 || p.GetAtUnixMs() <= 1_700_000_000_000 {
		t.Fatalf("first sample %v", p)
	}
	// Samples with the same values do not call changed.
	seen := map[int64]bool{}
	waitFor(t, "five samples", func() bool { seen[r.Pressure().GetAtUnixMs()] = true; return len(seen) >= 5 })
	if n := r.changed.Load(); n != 1 {
		t.Errorf("changed called %d times for unchanged pressure, want 1 (the start)", n)
	}

	write("pressure/memory", psi(40, 25))
	write("stat", "cpu 150 0 0 0 0 0 0 50 0 0\n") // half of 100 ticks stolen
	// Each changed() call saw the sample that caused it: the new PSI
	// values, and once the steal of the ticks between two readings.
	waitFor(t, "changed for the new values", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		psi, steal := false, false
		for _, p := range r.atCall {
			psi = psi || p.GetMemorySomeAvg10() == 40 && p.GetMemoryFullAvg10() == 25
			steal = steal || p.GetCpuStealPercent() == 50
		}
		return psi && steal
	})

	// Without a Sampler there is no pressure.
	r2 := start(t, Config{HW: newFakeHW(), XIDPoll: time.Hour})
	waitFor(t, "the first collection", func() bool { s, _ := r2.Inventory(); return s != nil })
	if p := r2.Pressure(); p != nil {
		t.Errorf("pressure without a Sampler: %v", p)
	}
}

// syncBuffer is a log destination the test reads while Run writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMonitorErrorsLogged: a failing source is logged once (component
// health), never stops the monitor, and its recovery is logged.
func TestMonitorErrorsLogged(t *testing.T) {
	var logs syncBuffer
	hw := newFakeHW()
	hw.invErr = errors.New("nvidia-smi hung")
	hw.xidErr = errors.New("open /dev/kmsg: permission denied")
	r := start(t, Config{HW: hw, Log: slog.New(slog.NewTextHandler(&logs, nil)), XIDPoll: 2 * time.Millisecond, InventoryEvery: 5 * time.Millisecond})
	waitFor(t, "many polls and collections", func() bool { return hw.pollCount() > 20 && hw.collections() > 5 })
	if s, h := r.Inventory(); s != nil || h != nil {
		t.Errorf("an inventory from a failed collection: %v", h)
	}
	out := logs.String()
	for _, want := range []string{"nvidia-smi hung", "permission denied"} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%q logged %d times, want once:\n%s", want, n, out)
		}
	}
	if !strings.Contains(out, "component=health") {
		t.Errorf("logs without component=health:\n%s", out)
	}
	// An Xid read with an error (the store's, without the kernel log's) is
	// still used.
	hw.set(func(f *fakeHW) { f.xids = []nvsmi.XID{{Code: 79, PCIBusID: "0000:18:00"}} })
	waitFor(t, "the condition", func() bool { return len(r.Conditions()) == 1 })

	hw.set(func(f *fakeHW) { f.invErr, f.xidErr = nil, nil })
	waitFor(t, "the inventory", func() bool { s, _ := r.Inventory(); return s != nil })
	waitFor(t, "both recoveries logged", func() bool { return strings.Count(logs.String(), "recovered") == 2 })
	if c := r.Conditions(); len(c) != 1 || c[0].Subject != fakehw.GPUUUID(1, 0) {
		t.Errorf("after the inventory arrived the condition is %v, want it on %s", c, fakehw.GPUUUID(1, 0))
	}
}

func TestRunWithoutHardware(t *testing.T) {
	if err := New(Config{}).Run(context.Background(), nil); err == nil {
		t.Fatal("Run without Hardware succeeded")
	}
}

// TestMonitorFakeMachine runs the monitor over fakehw.Hardware: a line in
// data_dir/fakehw/kmsg becomes a condition on that GPU; a burst of lines
// causes one extra collection; the condition survives a restart in the
// same boot; a GPU reset clears it; a new boot drops it.
func TestMonitorFakeMachine(t *testing.T) {
	const seed = 5
	dir := t.TempDir()
	fake := fakehw.Hardware{Seed: seed, DataDir: dir}
	gpus := fakehw.GPUs(seed)
	kmsg := func(lines ...string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(fake.KmsgPath()), 0o700); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(fake.KmsgPath(), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(strings.Join(lines, "")); err != nil {
			t.Fatal(err)
		}
	}
	seq := 0
	line := func(gpu, code int, msg string) string {
		seq++
		d, _, _ := strings.Cut(gpus[gpu].PCIBusID, ".")
		return fmt.Sprintf("3,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1234, name=x, %s\n", 1000+seq, 5678901+seq, d, code, msg)
	}
	cfg := func(hw nodekinds.Hardware) Config {
		return Config{HW: hw, XIDPoll: 5 * time.Millisecond, BurstDelay: 300 * time.Millisecond, InventoryEvery: time.Hour}
	}

	hw := &counting{Hardware: fake}
	r := start(t, cfg(hw))
	waitFor(t, "the first collection", func() bool { s, _ := r.Inventory(); return s != nil })
	if c := r.Conditions(); len(c) != 0 {
		t.Fatalf("conditions on a healthy machine: %v", c)
	}
	before := r.changed.Load()

	kmsg(line(3, 79, "GPU has fallen off the bus."))
	waitFor(t, "GPU 3's condition", func() bool { return len(r.Conditions()) == 1 })
	c := r.Conditions()[0]
	if c.Type != "Xid" || c.Subject != fakehw.GPUUUID(seed, 3) || c.Reason != "Xid 79" || !strings.HasPrefix(c.Message, "GPU has fallen off the bus. (the GPU has fallen off the bus; action: ") || c.Count != 1 || c.SinceUnixMs == 0 {
		t.Fatalf("condition %v, want Xid 79 on %s", c, fakehw.GPUUUID(seed, 3))
	}
	if r.changed.Load() <= before {
		t.Error("changed not called for the condition")
	}
	waitFor(t, "the first burst's collection", func() bool { return hw.invs.Load() == 2 })

	// A burst: three lines at once, one collection.
	kmsg(line(3, 45, "Preemptive cleanup"), line(6, 48, "DBE"), line(3, 31, "MMU Fault"))
	waitFor(t, "the burst's conditions", func() bool { c := r.Conditions(); return len(c) == 2 && c[0].Count+c[1].Count == 4 })
	waitFor(t, "the burst's collection", func() bool { return hw.invs.Load() == 3 })
	polls := hw.polls.Load()
	waitFor(t, "polls past BurstDelay", func() bool { return hw.polls.Load() > polls+80 })
	if n := hw.invs.Load(); n != 3 {
		t.Fatalf("%d collections, want 3 (start and two bursts)", n)
	}
	want := r.Conditions()
	for _, w := range want {
		if w.Subject == fakehw.GPUUUID(seed, 3) && (w.Count != 3 || w.Reason != "Xid 31" || w.SinceUnixMs != c.SinceUnixMs) {
			t.Errorf("GPU 3's condition after the burst %v, first seen at %d", w, c.SinceUnixMs)
		}
	}

	// A restart in the same boot keeps the conditions.
	r.stop(t)
	r2 := start(t, cfg(fake))
	waitFor(t, "the conditions after a restart", func() bool { return len(r2.Conditions()) == 2 })
	for i, c := range r2.Conditions() {
		if c.Subject != want[i].Subject || c.Count != want[i].Count || c.Reason != want[i].Reason {
			t.Errorf("after a restart: %v, want %v", c, want[i])
		}
	}

	// A reset of GPU 3 clears its condition at the next poll.
	before = r2.changed.Load()
	if err := fake.ResetGPU(context.Background(), gpus[3]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 3's condition to clear", func() bool { return len(r2.Conditions()) == 1 })
	if c := r2.Conditions()[0]; c.Subject != fakehw.GPUUUID(seed, 6) {
		t.Errorf("left %v, want GPU 6's", c)
	}
	if r2.changed.Load() <= before {
		t.Error("changed not called when the condition cleared")
	}

	// A new fake boot drops the rest.
	if err := os.WriteFile(filepath.Join(dir, "fakehw", "boot_id"), []byte("0f0e0d0c-0b0a-4908-8706-050403020100\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "no conditions in a new boot", func() bool { return len(r2.Conditions()) == 0 })
}
