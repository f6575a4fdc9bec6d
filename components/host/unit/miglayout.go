package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// MIGLayout is mig-layout: MIG mode and the GPU instances (each with its
// default compute instance) the spec names per GPU, through nvidia-smi. A
// GPU whose layout differs is changed only when nothing uses it: no hold
// of bcd's (an allocation's environment file in /run/bcd-alloc naming it or
// one of its MIG devices) and no compute process; otherwise the unit fails
// with ErrRefused and the GPU is left as it is. The devices section then
// sees the instances (docs/devices.md).
type MIGLayout struct{}

// MIGLayoutBody is mig-layout's settings.
type MIGLayoutBody struct {
	GPUs []MIGGPU `json:"gpus"`
}

// MIGGPU is one GPU's layout: its GPU instance profiles (1g.10gb, ...);
// none turns MIG off.
type MIGGPU struct {
	GPU      string   `json:"gpu"`
	Profiles []string `json:"profiles"`
}

func (MIGLayout) Name() string { return "mig-layout" }

func (m MIGLayout) decode(body json.RawMessage) (MIGLayoutBody, error) {
	var b MIGLayoutBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	seen := map[string]bool{}
	for _, g := range b.GPUs {
		if !isGPUUUID(g.GPU) {
			return b, invalid("gpu %q is not a GPU-<uuid>", clip(g.GPU))
		}
		if seen[strings.ToLower(g.GPU)] {
			return b, invalid("gpu %s is named twice", g.GPU)
		}
		seen[strings.ToLower(g.GPU)] = true
		if len(g.Profiles) > 7 {
			return b, invalid("gpu %s: %d instances, at most 7", g.GPU, len(g.Profiles))
		}
		for _, p := range g.Profiles {
			if !isMIGProfile(p) {
				return b, invalid("gpu %s: profile %q is not a MIG profile (1g.10gb)", g.GPU, clip(p))
			}
		}
	}
	return b, nil
}

func (m MIGLayout) Check(body json.RawMessage) error { _, err := m.decode(body); return err }

// migGPU is what one GPU has now and what the unit does to it.
type migGPU struct {
	uuid    string
	mode    bool // MIG mode wanted
	have    []string
	want    []string
	enable  bool // change the mode
	relayer bool // destroy and create the instances
}

func (m MIGLayout) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := m.decode(body)
	if err != nil {
		return Plan{}, err
	}
	if len(b.GPUs) == 0 {
		return Plan{}, nil
	}
	var want []string
	for _, g := range b.GPUs {
		want = append(want, g.GPU)
	}
	if err := checkGPUs(ctx, sys, want); err != nil {
		return Plan{}, err
	}
	modes, err := smiQuery(ctx, sys, "gpu", "uuid", "mig.mode.current")
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	var plan []migGPU
	for _, g := range b.GPUs {
		mg := migGPU{uuid: g.GPU, mode: len(g.Profiles) > 0, want: slices.Sorted(slices.Values(g.Profiles))}
		current := false
		for _, r := range modes {
			if strings.EqualFold(r[0], g.GPU) {
				current = r[1] == "Enabled"
			}
		}
		if current != mg.mode {
			mg.enable = true
			p.Changes = append(p.Changes, fmt.Sprintf("set MIG mode of %s to %v", g.GPU, mg.mode))
		}
		if current {
			if mg.have, err = gpuInstances(ctx, sys, g.GPU); err != nil {
				return Plan{}, err
			}
		}
		if mg.mode && !slices.Equal(mg.have, mg.want) {
			mg.relayer = true
			p.Changes = append(p.Changes, fmt.Sprintf("lay out %s as %s (now %s)", g.GPU, strings.Join(mg.want, ","), or(strings.Join(mg.have, ","), "none")))
		}
		if mg.enable || mg.relayer {
			plan = append(plan, mg)
		}
	}
	p.Detail = plan
	return p, nil
}

// gpuInstances lists a GPU's GPU instance profiles (nvidia-smi mig -lgi),
// sorted.
func gpuInstances(ctx context.Context, sys System, uuid string) ([]string, error) {
	out, err := sys.Run(ctx, "nvidia-smi", "mig", "-i", uuid, "-lgi")
	if err != nil {
		if strings.Contains(string(out), "No GPU instances found") {
			return nil, nil
		}
		return nil, err
	}
	var ps []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(strings.Trim(strings.TrimSpace(l), "|"))
		if len(f) >= 3 && f[1] == "MIG" && isMIGProfile(f[2]) {
			ps = append(ps, f[2])
		}
	}
	slices.Sort(ps)
	return ps, nil
}

// busy says why a GPU may not be changed now: a hold of bcd's on it or one
// of its MIG devices, or a compute process; "" when it is free.
func busy(ctx context.Context, sys System, uuid string) (string, error) {
	ids := []string{strings.ToLower(uuid)}
	out, err := sys.Run(ctx, "nvidia-smi", "-L")
	if err != nil {
		return "", err
	}
	in := false
	for _, l := range strings.Split(string(out), "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "GPU ") {
			in = strings.Contains(strings.ToLower(t), "(uuid: "+strings.ToLower(uuid)+")")
			continue
		}
		if in && strings.HasPrefix(t, "MIG ") {
			if i := strings.Index(t, "(UUID: "); i >= 0 {
				ids = append(ids, strings.ToLower(strings.TrimSuffix(t[i+7:], ")")))
			}
		}
	}
	for _, f := range sys.Glob("/run/bcd-alloc/*.env") {
		b, err := sys.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(l, "NVIDIA_VISIBLE_DEVICES=")
			if !ok {
				continue
			}
			for _, d := range strings.Split(v, ",") {
				if slices.Contains(ids, strings.ToLower(d)) {
					return "held by allocation " + strings.TrimSuffix(f[strings.LastIndex(f, "/")+1:], ".env"), nil
				}
			}
		}
	}
	procs, err := smiQuery(ctx, sys, "compute-apps", "gpu_uuid", "pid")
	if err != nil {
		return "", err
	}
	for _, r := range procs {
		if slices.Contains(ids, strings.ToLower(r[0])) {
			return "process " + r[1] + " runs on it", nil
		}
	}
	return "", nil
}

func (m MIGLayout) Apply(ctx context.Context, sys System, _ json.RawMessage, p Plan) error {
	plan, _ := p.Detail.([]migGPU)
	var errs []string
	for _, g := range plan {
		why, err := busy(ctx, sys, g.uuid)
		if err != nil {
			return err
		}
		if why != "" {
			errs = append(errs, fmt.Sprintf("%s is not changed: %s", g.uuid, why))
			continue
		}
		if len(g.have) > 0 && (g.relayer || g.enable) {
			// Compute instances first, then the GPU instances.
			if _, err := sys.Run(ctx, "nvidia-smi", "mig", "-i", g.uuid, "-dci"); err != nil {
				return err
			}
			if _, err := sys.Run(ctx, "nvidia-smi", "mig", "-i", g.uuid, "-dgi"); err != nil {
				return err
			}
		}
		if g.enable {
			if _, err := sys.Run(ctx, "nvidia-smi", "-i", g.uuid, "-mig", map[bool]string{true: "1", false: "0"}[g.mode]); err != nil {
				return err
			}
		}
		if g.mode && len(g.want) > 0 {
			if _, err := sys.Run(ctx, "nvidia-smi", "mig", "-i", g.uuid, "-cgi", strings.Join(g.want, ","), "-C"); err != nil {
				return err
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrRefused, strings.Join(errs, "; "))
	}
	return nil
}
