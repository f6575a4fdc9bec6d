package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// FabricManager is fabric-manager: NVIDIA's fabric manager service on
// NVSwitch systems, enabled and running. Not running raises
// FabricManagerDown (the GPUs of an NVSwitch system take no CUDA work
// without it).
type FabricManager struct{}

// FabricManagerBody is fabric-manager's settings.
type FabricManagerBody struct {
	Enabled bool `json:"enabled"`
}

// FabricManagerService is the service the unit runs.
const FabricManagerService = "nvidia-fabricmanager.service"

func (FabricManager) Name() string { return "fabric-manager" }

func (f FabricManager) Check(body json.RawMessage) error {
	var b FabricManagerBody
	return decode(body, &b)
}

// serviceState answers systemctl's LoadState, ActiveState and
// UnitFileState of a unit.
func serviceState(ctx context.Context, sys System, unit string) (load, active, enabled string, err error) {
	out, err := sys.Run(ctx, "systemctl", "show", "--property=LoadState,ActiveState,UnitFileState", unit)
	if err != nil {
		return "", "", "", err
	}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(l), "=")
		switch k {
		case "LoadState":
			load = v
		case "ActiveState":
			active = v
		case "UnitFileState":
			enabled = v
		}
	}
	return load, active, enabled, nil
}

func (f FabricManager) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	var b FabricManagerBody
	if err := decode(body, &b); err != nil {
		return Plan{}, err
	}
	if !b.Enabled {
		return Plan{}, nil
	}
	load, active, enabled, err := serviceState(ctx, sys, FabricManagerService)
	if err != nil {
		return Plan{}, err
	}
	if load != "loaded" {
		return Plan{Conditions: []Condition{{FabricManagerDown, "fabric-manager: " + FabricManagerService + " is not installed"}}},
			fmt.Errorf("%s is not installed (LoadState %s; install NVIDIA's fabric manager package of the driver's branch)", FabricManagerService, or(load, "unknown"))
	}
	var p Plan
	if active != "active" {
		p.Conditions = append(p.Conditions, Condition{FabricManagerDown, "fabric-manager: " + FabricManagerService + " is " + or(active, "unknown")})
	}
	if active != "active" || enabled != "enabled" {
		p.Changes = append(p.Changes, fmt.Sprintf("systemctl enable --now %s (%s, %s)", FabricManagerService, active, enabled))
	}
	return p, nil
}

func (f FabricManager) Apply(ctx context.Context, sys System, _ json.RawMessage, _ Plan) error {
	if _, err := sys.Run(ctx, "systemctl", "enable", "--now", FabricManagerService); err != nil {
		return err
	}
	_, active, _, err := serviceState(ctx, sys, FabricManagerService)
	if err != nil {
		return err
	}
	if active != "active" {
		return fmt.Errorf("%s is %s after it was started (journalctl -u %s)", FabricManagerService, active, FabricManagerService)
	}
	return nil
}
