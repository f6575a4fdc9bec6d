package nodekinds

import (
	"context"
	"time"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/machine/doctor"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// StatusGPUs reads one line per GPU for bcd status from nvidia-smi now
// (bounded to 5 s), with the verdict of the health checks (Health): a GPU
// with a failed check is UNHEALTHY. None without nvidia-smi.
func StatusGPUs(hw Hardware) func(context.Context) []status.GPU {
	return func(ctx context.Context) []status.GPU {
		if hw.SMI() == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		j := Health(ctx, hw)
		out := make([]status.GPU, 0, len(j.GPUs))
		for _, g := range j.GPUs {
			verdict, problems := Verdict(Of(j.Findings, g))
			h := map[nvsmi.Status]string{nvsmi.StatusPass: status.HealthOK, nvsmi.StatusWarn: status.HealthWarn, nvsmi.StatusFail: status.HealthUnhealthy}[verdict]
			out = append(out, status.GPU{
				Index: g.Index, UUID: g.UUID, Name: g.Name, UtilizationPct: g.Sample.UtilizationGPU, TemperatureC: g.Sample.TemperatureC,
				PowerW: g.Sample.PowerDrawW, PowerLimitW: g.PowerLimitW, MemoryUsedMiB: g.Sample.MemoryUsedMiB, MemoryTotalMiB: g.MemoryTotalMiB,
				Health: h, Problems: problems,
			})
		}
		return out
	}
}

// Verdict is a GPU's worst status over its findings and, worst first, the
// reason of each finding that did not pass, with its action.
func Verdict(fs []nvsmi.Finding) (nvsmi.Status, []string) {
	var fails, warns []string
	for _, f := range fs {
		line := f.Reason
		if f.Action != "" {
			line += " (" + f.Action + ")"
		}
		switch f.Status {
		case nvsmi.StatusFail:
			fails = append(fails, line)
		case nvsmi.StatusWarn:
			warns = append(warns, line)
		}
	}
	return nvsmi.Worst(fs), append(fails, warns...)
}

// DoctorChecks are the node's hardware checks for bcd doctor: nvml (the
// driver through nvidia-smi), hardware (the inventory) and one gpu line per
// GPU with the verdict of the health checks (Health).
func DoctorChecks(hw Hardware, backend string) []doctor.Check {
	return []doctor.Check{
		doctor.NVML(func(ctx context.Context) (string, int, error) {
			run := hw.SMI()
			if run == nil {
				return "", 0, nvsmi.ErrNotFound
			}
			return nvsmi.Probe(ctx, run)
		}),
		doctor.Hardware(backend, func(ctx context.Context) (int, int, error) {
			inv, err := hw.Inventory(ctx)
			if err != nil {
				return 0, 0, err
			}
			return len(inv.GPUs), len(inv.Sections()), nil
		}),
		doctor.GPUs(func(ctx context.Context) []doctor.GPU {
			j := Health(ctx, hw)
			out := make([]doctor.GPU, 0, len(j.GPUs))
			for _, g := range j.GPUs {
				verdict, problems := Verdict(Of(j.Findings, g))
				st := map[nvsmi.Status]doctor.Status{nvsmi.StatusPass: doctor.OK, nvsmi.StatusWarn: doctor.Warn, nvsmi.StatusFail: doctor.Fail}[verdict]
				out = append(out, doctor.GPU{
					UUID: g.UUID, Name: g.Name, BusyPct: g.Sample.UtilizationGPU, TemperatureC: g.Sample.TemperatureC,
					PowerW: g.Sample.PowerDrawW, PowerLimitW: g.PowerLimitW, MemoryUsedMiB: g.Sample.MemoryUsedMiB, MemoryTotalMiB: g.MemoryTotalMiB,
					Status: st, Problems: problems,
				})
			}
			return out
		}),
	}
}
