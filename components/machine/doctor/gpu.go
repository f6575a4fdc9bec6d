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
