package doctor

import (
	"context"
	"fmt"
	"strings"
)

// NVML checks the NVIDIA driver through probe, which returns the driver
// version and the number of GPUs (nvsmi.Probe over nvidia-smi). A host
// without nvidia-smi is a warning, a driver that does not answer a
// failure. A nil probe (a build without NVML) is a warning.
func NVML(probe func(ctx context.Context) (driver string, count int, err error)) Check {
	return Check{Name: "nvml", Run: func(ctx context.Context) Result {
		r := Result{Name: "nvml"}
		if probe == nil {
			r.Status, r.Detail = Warn, "NVML is not available in this build"
			return r
		}
		driver, n, err := probe(ctx)
		switch {
		case err != nil && strings.Contains(err.Error(), "nvidia-smi not found"):
			r.Status, r.Detail = Warn, "nvidia-smi not found (no NVIDIA driver on this host)"
		case err != nil:
			r.Status, r.Detail = Fail, err.Error()
		case n == 0:
			r.Status, r.Detail = Warn, fmt.Sprintf("driver %s, no GPUs", driver)
		default:
			r.Status, r.Detail = OK, fmt.Sprintf("driver %s, %s", driver, plural(n, "GPU"))
		}
		return r
	}}
}

// Hardware checks that the hardware backend (host or fakehw, named by
// backend) collects an inventory, through collect, which returns the GPUs
// found and the inventory sections hashed. Failing to collect is a
// failure: the agent could not report this machine.
func Hardware(backend string, collect func(ctx context.Context) (gpus, sections int, err error)) Check {
	return Check{Name: "hardware", Run: func(ctx context.Context) Result {
		r := Result{Name: "hardware"}
		if collect == nil {
			r.Status, r.Detail = Warn, "no hardware backend in this build"
			return r
		}
		gpus, sections, err := collect(ctx)
		if err != nil {
			r.Status, r.Detail = Fail, fmt.Sprintf("%s: collecting the inventory failed: %v", backend, err)
			return r
		}
		r.Status, r.Detail = OK, fmt.Sprintf("%s: %s, %d inventory sections hashed", backend, plural(gpus, "GPU"), sections)
		return r
	}}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// GPU is one GPU for its doctor line: what it is, what it is doing, and
// the verdict of the health checks with the problems, worst first.
type GPU struct {
	UUID, Name                    string
	BusyPct, TemperatureC         float64
	PowerW, PowerLimitW           float64
	MemoryUsedMiB, MemoryTotalMiB int64
	Status                        Status
	Problems                      []string
}

// GPUs prints one gpu line per GPU list returns: its UUID (shortened) and
// name, how busy it is, its temperature, power draw of its limit and
// memory used of its total; a warning or failure adds its problems. The
// verdicts come from the same checks as diag.nvml. No GPU, no line.
func GPUs(list func(ctx context.Context) []GPU) Check {
	return Check{Name: "gpu", Many: func(ctx context.Context) []Result {
		if list == nil {
			return nil
		}
		var out []Result
		for _, g := range list(ctx) {
			d := fmt.Sprintf("%s %s: %.0f%% busy, %.0f C, %.0f/%.0f W, %.1f/%.1f GiB",
				shortUUID(g.UUID), g.Name, g.BusyPct, g.TemperatureC, g.PowerW, g.PowerLimitW,
				float64(g.MemoryUsedMiB)/1024, float64(g.MemoryTotalMiB)/1024)
			st := g.Status
			if st == "" {
				st = OK
			}
			if st != OK && len(g.Problems) > 0 {
				d += "; " + strings.Join(g.Problems, "; ")
			}
			out = append(out, Result{Name: "gpu", Status: st, Detail: d})
		}
		return out
	}}
}

// shortUUID keeps "GPU-" and the first four hex digits: "GPU-5f1c…".
func shortUUID(u string) string {
	if len(u) <= 8 {
		return u
	}
	return u[:8] + "…"
}
