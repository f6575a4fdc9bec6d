package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// CPU is cpu: the cpufreq governor of every CPU, written now (the kernel
// forgets it at boot, so every pass after a boot writes it again), and CPU
// isolation on the kernel command line (isolcpus, nohz_full, rcu_nocbs):
// RebootRequired until the running kernel has it.
type CPU struct{}

// CPUBody is cpu's settings.
type CPUBody struct {
	// Governor is a cpufreq governor (performance, powersave, ...).
	Governor string `json:"governor,omitempty"`
	// Isolate is a cpulist kept from the scheduler's general use.
	Isolate string `json:"isolate,omitempty"`
}

func (CPU) Name() string { return "cpu" }

func (c CPU) decode(body json.RawMessage) (CPUBody, error) {
	var b CPUBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if b.Governor != "" && !isGovernor(b.Governor) {
		return b, invalid("governor %q is not [a-z], 1 to 32 characters", clip(b.Governor))
	}
	if b.Isolate != "" && !isCPUList(b.Isolate) {
		return b, invalid("isolate %q is not a cpulist (0-3,8)", clip(b.Isolate))
	}
	return b, nil
}

func (c CPU) Check(body json.RawMessage) error { _, err := c.decode(body); return err }

func (c CPU) args(b CPUBody) []string {
	if b.Isolate == "" {
		return nil
	}
	return []string{"isolcpus=" + b.Isolate, "nohz_full=" + b.Isolate, "rcu_nocbs=" + b.Isolate}
}

type cpuPlan struct {
	governors []string // scaling_governor files to write
	cmdline   cmdlinePlan
}

func (c CPU) Plan(_ context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := c.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	var d cpuPlan
	if b.Governor != "" {
		files := sys.Glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")
		if len(files) == 0 {
			return Plan{}, fmt.Errorf("%w: governor %s: this host has no cpufreq (no scaling_governor under /sys/devices/system/cpu)", ErrUnsupported, b.Governor)
		}
		for _, f := range files {
			have, err := sys.ReadFile(f)
			if err != nil {
				return Plan{}, err
			}
			if strings.TrimSpace(string(have)) != b.Governor {
				d.governors = append(d.governors, f)
			}
		}
		if len(d.governors) > 0 {
			p.Changes = append(p.Changes, fmt.Sprintf("set the governor of %d CPUs to %s", len(d.governors), b.Governor))
		}
	}
	if d.cmdline, err = planCmdline(sys, c.Name(), c.args(b), &p); err != nil {
		return Plan{}, err
	}
	p.Detail = d
	return p, nil
}

func (c CPU) Apply(ctx context.Context, sys System, body json.RawMessage, p Plan) error {
	d, ok := p.Detail.(cpuPlan)
	if !ok {
		return fmt.Errorf("cpu: no plan")
	}
	b, err := c.decode(body)
	if err != nil {
		return err
	}
	for _, f := range d.governors {
		if err := sys.WriteKernel(f, b.Governor); err != nil {
			return fmt.Errorf("governor %s: %w (is it one of scaling_available_governors?)", b.Governor, err)
		}
	}
	return applyCmdline(ctx, sys, d.cmdline)
}
