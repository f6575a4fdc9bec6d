package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// GPUSettings is gpu-settings: persistence mode, the power limit, the
// application clocks and the compute mode of every GPU, through
// nvidia-smi. None persists across a reboot in the driver: the pass after
// a boot sets them again.
type GPUSettings struct{}

// GPUSettingsBody is gpu-settings' settings; an unset field is left as it is.
type GPUSettingsBody struct {
	PersistenceMode *bool `json:"persistence_mode,omitempty"`
	// PowerLimitW is the power limit in watts.
	PowerLimitW uint32 `json:"power_limit_w,omitempty"`
	// ComputeMode is DEFAULT, EXCLUSIVE_PROCESS or PROHIBITED.
	ComputeMode string `json:"compute_mode,omitempty"`
	// ApplicationClocks are the memory and graphics clocks in MHz.
	ApplicationClocks *Clocks `json:"application_clocks,omitempty"`
}

// Clocks are application clocks in MHz.
type Clocks struct {
	MemoryMHz   uint32 `json:"memory_mhz"`
	GraphicsMHz uint32 `json:"graphics_mhz"`
}

// computeModes are nvidia-smi's names and -c values.
var computeModes = map[string]string{"DEFAULT": "0", "EXCLUSIVE_PROCESS": "3", "PROHIBITED": "2"}

func (GPUSettings) Name() string { return "gpu-settings" }

func (g GPUSettings) decode(body json.RawMessage) (GPUSettingsBody, error) {
	var b GPUSettingsBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	if b.ComputeMode != "" && computeModes[b.ComputeMode] == "" {
		return b, invalid("compute_mode %q is not DEFAULT, EXCLUSIVE_PROCESS or PROHIBITED", clip(b.ComputeMode))
	}
	if b.PowerLimitW > 5000 {
		return b, invalid("power_limit_w %d is over 5000", b.PowerLimitW)
	}
	if c := b.ApplicationClocks; c != nil && (c.MemoryMHz == 0 || c.GraphicsMHz == 0 || c.MemoryMHz > 100000 || c.GraphicsMHz > 100000) {
		return b, invalid("application_clocks need memory_mhz and graphics_mhz, 1 to 100000")
	}
	return b, nil
}

func (g GPUSettings) Check(body json.RawMessage) error { _, err := g.decode(body); return err }

func (g GPUSettings) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := g.decode(body)
	if err != nil {
		return Plan{}, err
	}
	if absent(body) {
		return Plan{}, nil
	}
	rows, err := smiQuery(ctx, sys, "gpu", "uuid", "persistence_mode", "power.limit", "compute_mode", "clocks.applications.memory", "clocks.applications.graphics")
	if err != nil {
		return Plan{}, err
	}
	var cmds [][]string
	for _, r := range rows {
		uuid := r[0]
		if b.PersistenceMode != nil {
			want := map[bool]string{true: "Enabled", false: "Disabled"}[*b.PersistenceMode]
			if r[1] != want {
				cmds = append(cmds, []string{"-i", uuid, "-pm", map[bool]string{true: "1", false: "0"}[*b.PersistenceMode]})
			}
		}
		if b.PowerLimitW != 0 {
			have, err := strconv.ParseFloat(r[2], 64)
			if err != nil || int64(have+0.5) != int64(b.PowerLimitW) {
				cmds = append(cmds, []string{"-i", uuid, "-pl", strconv.FormatUint(uint64(b.PowerLimitW), 10)})
			}
		}
		if b.ComputeMode != "" && normalMode(r[3]) != b.ComputeMode {
			cmds = append(cmds, []string{"-i", uuid, "-c", computeModes[b.ComputeMode]})
		}
		if c := b.ApplicationClocks; c != nil && (r[4] != strconv.FormatUint(uint64(c.MemoryMHz), 10) || r[5] != strconv.FormatUint(uint64(c.GraphicsMHz), 10)) {
			cmds = append(cmds, []string{"-i", uuid, "-ac", fmt.Sprintf("%d,%d", c.MemoryMHz, c.GraphicsMHz)})
		}
	}
	var p Plan
	for _, c := range cmds {
		p.Changes = append(p.Changes, "nvidia-smi "+strings.Join(c, " "))
	}
	p.Detail = cmds
	return p, nil
}

// normalMode reads nvidia-smi's compute mode as it prints it ("Default",
// "Exclusive_Process", "Prohibited").
func normalMode(s string) string {
	switch s {
	case "Default":
		return "DEFAULT"
	case "Exclusive_Process":
		return "EXCLUSIVE_PROCESS"
	case "Prohibited":
		return "PROHIBITED"
	}
	return s
}

func (g GPUSettings) Apply(ctx context.Context, sys System, _ json.RawMessage, p Plan) error {
	cmds, _ := p.Detail.([][]string)
	for _, c := range cmds {
		if _, err := sys.Run(ctx, "nvidia-smi", c...); err != nil {
			return err
		}
	}
	return nil
}
