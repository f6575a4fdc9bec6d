package nodemetrics

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/agent/telemetry"
	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/health"
)

func byName(ms []telemetry.Metric) map[string]telemetry.Metric {
	out := map[string]telemetry.Metric{}
	for _, m := range ms {
		out[m.Name] = m
	}
	return out
}

// TestGPUsOfTheFakeMachine reads the fake HGX node's nvidia-smi: every
// bcd.gpu metric has one point per GPU (two for ECC and remaps, by type),
// each named by its uuid and index, and a held GPU names its allocation.
func TestGPUsOfTheFakeMachine(t *testing.T) {
	hw := fakehw.Hardware{Seed: 3, DataDir: t.TempDir()}
	mon := health.New(health.Config{HW: hw})
	held := ""
	src := GPUs(Config{SMI: hw.SMI(), Monitor: mon, HeldBy: func(uuid string) string {
		if held == "" {
			held = uuid
		}
		if uuid == held {
			return "alloc_1"
		}
		return ""
	}})
	ms := byName(src(context.Background()))
	for _, name := range []string{"bcd.gpu.utilization", "bcd.gpu.memory.used", "bcd.gpu.memory.total", "bcd.gpu.temperature",
		"bcd.gpu.power.draw", "bcd.gpu.power.limit", "bcd.gpu.xid.count", "bcd.gpu.held", "bcd.gpu.healthy"} {
		m, ok := ms[name]
		if !ok || len(m.Points) != 8 {
			t.Fatalf("%s: %d points, want 8", name, len(m.Points))
		}
		uuids := map[string]bool{}
		for _, p := range m.Points {
			for _, a := range p.Attrs {
				if a.Key == "gpu.uuid" {
					uuids[a.Value] = true
				}
			}
		}
		if len(uuids) != 8 {
			t.Fatalf("%s names %d GPUs", name, len(uuids))
		}
	}
	for _, name := range []string{"bcd.gpu.ecc.errors", "bcd.gpu.row_remap.rows"} {
		if m := ms[name]; len(m.Points) != 16 || m.Kind != telemetry.Counter {
			t.Fatalf("%s: %d points (kind %d), want 16 counters", name, len(m.Points), m.Kind)
		}
	}
	heldPoints := 0
	for _, p := range ms["bcd.gpu.held"].Points {
		if p.Value == 1 {
			heldPoints++
			if p.Attrs[len(p.Attrs)-1] != (telemetry.Attr{Key: "bcd.allocation", Value: "alloc_1"}) {
				t.Fatalf("the held GPU's attributes %v", p.Attrs)
			}
		}
	}
	if heldPoints != 1 {
		t.Fatalf("%d GPUs held, want 1", heldPoints)
	}
	for _, p := range ms["bcd.gpu.utilization"].Points {
		if p.Value < 0 || p.Value > 1 {
			t.Fatalf("utilization %v is not a share", p.Value)
		}
	}
}

// TestNoSMI: a machine without nvidia-smi has no GPU metrics.
func TestNoSMI(t *testing.T) {
	if ms := GPUs(Config{})(context.Background()); len(ms) != 0 {
		t.Fatalf("%d metrics without nvidia-smi", len(ms))
	}
}

// TestHost reads a procfs tree: the CPU's busy share between two
// collections and the memory.
func TestHost(t *testing.T) {
	root := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("meminfo", "MemTotal: 1000 kB\nMemAvailable: 250 kB\n")
	write("stat", "cpu 100 0 0 100 0 0 0 0 0 0\n")
	src := Host(Config{ProcRoot: root})
	first := byName(src(context.Background()))
	if _, ok := first["bcd.host.cpu.utilization"]; ok {
		t.Fatal("a busy share from one reading")
	}
	if m := first["bcd.host.memory.available"]; len(m.Points) != 1 || m.Points[0].Value != 250*1024 {
		t.Fatalf("memory available %+v", m)
	}
	write("stat", "cpu 175 0 0 125 0 0 0 0 0 0\n")
	if m := byName(src(context.Background()))["bcd.host.cpu.utilization"]; len(m.Points) != 1 || m.Points[0].Value != 0.75 {
		t.Fatalf("cpu utilization %+v, want 0.75", m)
	}
}
