// Package nodemetrics is the node's telemetry sources: bcd.gpu.* per GPU
// from `nvidia-smi -q -x` (utilisation, memory, temperature, power, ECC,
// row remaps), the health monitor's Xid counts and verdicts and the
// devices section's holds; bcd.host.* from procfs (CPU busy share,
// memory) and the monitor's pressure sample (PSI, steal). The agent adds
// its own (session, journal, certificate) and exports them all
// (components/agent/telemetry, docs/telemetry.md).
package nodemetrics

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/better-compute/bcd/components/agent/telemetry"
	"github.com/better-compute/bcd/components/machine/health"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/pressure"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Config is what the sources read.
type Config struct {
	// SMI runs nvidia-smi; nil: no GPU metrics.
	SMI nvsmi.Runner
	// Monitor gives Xid counts, GPU verdicts and pressure; nil: none.
	Monitor *health.Monitor
	// HeldBy names the allocation holding a GPU ("" free); nil: none.
	HeldBy func(uuid string) string
	// ProcRoot is procfs ("/proc").
	ProcRoot string
}

// GPUs is the bcd.gpu.* source.
func GPUs(c Config) telemetry.Source {
	return func(ctx context.Context) []telemetry.Metric {
		if c.SMI == nil {
			return nil
		}
		out, err := c.SMI(ctx, "-q", "-x")
		if err != nil {
			return nil
		}
		gpus, err := nvsmi.ParseXML(bytes.NewReader(out))
		if err != nil {
			return nil
		}
		xids := map[string]float64{}
		if c.Monitor != nil {
			for _, cond := range c.Monitor.Conditions() {
				if cond.GetType() == health.ConditionXid {
					xids[cond.GetSubject()] += float64(cond.GetCount())
				}
			}
		}
		return gpuMetrics(gpus, xids, c)
	}
}

// metric names and units of the GPU source, in the order exported.
type gauge struct {
	name, unit, desc string
	kind             telemetry.Kind
}

var (
	gUtil     = gauge{"bcd.gpu.utilization", "1", "share of time the GPU was busy", telemetry.Gauge}
	gMemUsed  = gauge{"bcd.gpu.memory.used", "By", "framebuffer memory in use", telemetry.Gauge}
	gMemTotal = gauge{"bcd.gpu.memory.total", "By", "framebuffer memory", telemetry.Gauge}
	gTemp     = gauge{"bcd.gpu.temperature", "Cel", "GPU temperature", telemetry.Gauge}
	gPower    = gauge{"bcd.gpu.power.draw", "W", "power drawn", telemetry.Gauge}
	gLimit    = gauge{"bcd.gpu.power.limit", "W", "power limit", telemetry.Gauge}
	gECC      = gauge{"bcd.gpu.ecc.errors", "{error}", "ECC errors over the GPU's life (aggregate)", telemetry.Counter}
	gRemap    = gauge{"bcd.gpu.row_remap.rows", "{row}", "rows remapped", telemetry.Counter}
	gRemapPnd = gauge{"bcd.gpu.row_remap.pending", "1", "1 while a row remap waits for a GPU reset", telemetry.Gauge}
	gRemapFl  = gauge{"bcd.gpu.row_remap.failed", "1", "1 when a row remap failed (no spare rows)", telemetry.Gauge}
	gXid      = gauge{"bcd.gpu.xid.count", "{xid}", "NVIDIA Xid errors this boot", telemetry.Counter}
	gHeld     = gauge{"bcd.gpu.held", "1", "1 while an allocation holds the GPU (attribute bcd.allocation)", telemetry.Gauge}
	gHealthy  = gauge{"bcd.gpu.healthy", "1", "1 while the GPU may take new work", telemetry.Gauge}
)

func gpuMetrics(gpus []nvsmi.GPU, xids map[string]float64, c Config) []telemetry.Metric {
	byName := map[gauge]*telemetry.Metric{}
	var order []gauge
	add := func(g gauge, v float64, attrs ...telemetry.Attr) {
		m := byName[g]
		if m == nil {
			m = &telemetry.Metric{Name: g.name, Unit: g.unit, Description: g.desc, Kind: g.kind}
			byName[g] = m
			order = append(order, g)
		}
		m.Points = append(m.Points, telemetry.Point{Attrs: attrs, Value: v})
	}
	for _, g := range gpus {
		id := []telemetry.Attr{{Key: "gpu.uuid", Value: g.UUID}, {Key: "gpu.index", Value: strconv.Itoa(g.Index)}}
		with := func(k, v string) []telemetry.Attr {
			return append(append([]telemetry.Attr{}, id...), telemetry.Attr{Key: k, Value: v})
		}
		add(gUtil, g.Sample.UtilizationGPU/100, id...)
		add(gMemUsed, float64(g.Sample.MemoryUsedMiB)*(1<<20), id...)
		add(gMemTotal, float64(g.MemoryTotalMiB)*(1<<20), id...)
		add(gTemp, g.Sample.TemperatureC, id...)
		add(gPower, g.Sample.PowerDrawW, id...)
		if g.PowerLimitW > 0 {
			add(gLimit, g.PowerLimitW, id...)
		}
		if e := g.ECC.Aggregate; e.Supported {
			add(gECC, float64(e.Correctable), with("type", "correctable")...)
			add(gECC, float64(e.Uncorrectable), with("type", "uncorrectable")...)
		}
		if r := g.RowRemap; r != nil {
			add(gRemap, float64(r.Correctable), with("type", "correctable")...)
			add(gRemap, float64(r.Uncorrectable), with("type", "uncorrectable")...)
			add(gRemapPnd, b2f(r.Pending), id...)
			add(gRemapFl, b2f(r.Failure), id...)
		}
		add(gXid, xids[g.UUID], id...)
		if c.HeldBy != nil {
			alloc := c.HeldBy(g.UUID)
			add(gHeld, b2f(alloc != ""), with("bcd.allocation", alloc)...)
		}
		if c.Monitor != nil {
			bad, _ := c.Monitor.Unhealthy(g.UUID)
			add(gHealthy, b2f(!bad), id...)
		}
	}
	out := make([]telemetry.Metric, 0, len(order))
	for _, g := range order {
		out = append(out, *byName[g])
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Host is the bcd.host.* source of the machine: the CPU's busy share
// since the last collection, memory, and the monitor's latest PSI and
// steal sample.
func Host(c Config) telemetry.Source {
	var (
		mu   sync.Mutex
		prev pressure.CPUTimes
		have bool
	)
	return func(context.Context) []telemetry.Metric {
		var out []telemetry.Metric
		if b, err := os.ReadFile(filepath.Join(c.ProcRoot, "stat")); err == nil {
			if t, err := pressure.ParseStat(b); err == nil {
				mu.Lock()
				if have {
					out = append(out, telemetry.Value("bcd.host.cpu.utilization", "1", "share of CPU time spent working since the last collection", telemetry.Gauge, pressure.BusyShare(prev, t)))
				}
				prev, have = t, true
				mu.Unlock()
			}
		}
		if b, err := os.ReadFile(filepath.Join(c.ProcRoot, "meminfo")); err == nil {
			if m, err := pressure.ParseMeminfo(b); err == nil {
				out = append(out,
					telemetry.Value("bcd.host.memory.total", "By", "memory", telemetry.Gauge, float64(m.Total)),
					telemetry.Value("bcd.host.memory.available", "By", "memory available for new work", telemetry.Gauge, float64(m.Available)))
			}
		}
		if c.Monitor != nil {
			if p := c.Monitor.Pressure(); p != nil {
				out = append(out, pressureMetrics(p)...)
			}
		}
		return out
	}
}

func pressureMetrics(p *bcdv1.Pressure) []telemetry.Metric {
	out := []telemetry.Metric{telemetry.Value("bcd.host.cpu.steal", "1", "share of CPU time stolen by the hypervisor", telemetry.Gauge, p.GetCpuStealPercent()/100)}
	if !p.GetAvailable() {
		return out
	}
	psi := telemetry.Metric{Name: "bcd.host.pressure", Unit: "%", Description: "PSI: share of time tasks stalled on the resource, 10 s average", Kind: telemetry.Gauge}
	for _, x := range []struct {
		res, kind string
		v         float64
	}{
		{"cpu", "some", p.GetCpuSomeAvg10()}, {"memory", "some", p.GetMemorySomeAvg10()}, {"memory", "full", p.GetMemoryFullAvg10()},
		{"io", "some", p.GetIoSomeAvg10()}, {"io", "full", p.GetIoFullAvg10()},
	} {
		psi.Points = append(psi.Points, telemetry.Point{Attrs: []telemetry.Attr{{Key: "resource", Value: x.res}, {Key: "stall", Value: x.kind}}, Value: x.v})
	}
	return append(out, psi)
}
