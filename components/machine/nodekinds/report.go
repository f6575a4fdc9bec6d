package nodekinds

import (
	"context"
	"time"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/machine/doctor"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// StatusGPUs reads one line per GPU for bcd status from nvidia-smi now
// (bounded to 5 s); none without nvidia-smi.
func StatusGPUs(hw Hardware) func(context.Context) []status.GPU {
	return func(ctx context.Context) []status.GPU {
		run := hw.SMI()
		if run == nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		gpus, _ := nvsmi.Collect(ctx, run)
		out := make([]status.GPU, 0, len(gpus))
		for _, g := range gpus {
			out = append(out, status.GPU{
				Index: g.Index, UUID: g.UUID, Name: g.Name, UtilizationPct: g.Sample.UtilizationGPU, TemperatureC: g.Sample.TemperatureC,
				PowerW: g.Sample.PowerDrawW, PowerLimitW: g.PowerLimitW, MemoryUsedMiB: g.Sample.MemoryUsedMiB, MemoryTotalMiB: g.MemoryTotalMiB,
			})
		}
		return out
	}
}

// DoctorChecks are the node's hardware checks for bcd doctor: nvml (the
// driver through nvidia-smi) and hardware (the inventory).
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
	}
}
