package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
)

// ContainerToolkit is container-toolkit: the NVIDIA container toolkit's
// CDI specification of the host's GPUs (/etc/cdi/nvidia.yaml, made by
// nvidia-ctk cdi generate, made again when the driver version changes) and
// the container runtimes' NVIDIA runtime, each in a drop-in bcd owns
// (nvidia-ctk runtime configure --config=...): containerd
// /etc/containerd/conf.d/99-bcd-nvidia.toml (read when containerd's
// config imports conf.d), CRI-O /etc/crio/crio.conf.d/99-bcd-nvidia.conf.
// A running runtime is restarted to read it.
type ContainerToolkit struct{}

// ContainerToolkitBody is container-toolkit's settings.
type ContainerToolkitBody struct {
	CDI      bool     `json:"cdi,omitempty"`
	Runtimes []string `json:"runtimes,omitempty"`
}

// Files container-toolkit owns.
const NvidiaCDIFile = "/etc/cdi/nvidia.yaml"

// runtimeDropIns are the runtimes the unit configures, with their
// drop-in and service.
var runtimeDropIns = map[string][2]string{
	"containerd": {"/etc/containerd/conf.d/99-bcd-nvidia.toml", "containerd.service"},
	"crio":       {"/etc/crio/crio.conf.d/99-bcd-nvidia.conf", "crio.service"},
}

func (ContainerToolkit) Name() string { return "container-toolkit" }

func (c ContainerToolkit) decode(body json.RawMessage) (ContainerToolkitBody, error) {
	var b ContainerToolkitBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	seen := map[string]bool{}
	for _, r := range b.Runtimes {
		if _, ok := runtimeDropIns[r]; !ok || seen[r] {
			return b, invalid("runtime %q is not containerd or crio, or is given twice", clip(r))
		}
		seen[r] = true
	}
	return b, nil
}

func (c ContainerToolkit) Check(body json.RawMessage) error { _, err := c.decode(body); return err }

type toolkitPlan struct {
	cdi      bool
	runtimes []string
}

func (c ContainerToolkit) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := c.decode(body)
	if err != nil {
		return Plan{}, err
	}
	if !b.CDI && len(b.Runtimes) == 0 {
		return Plan{}, nil
	}
	if !sys.Has("nvidia-ctk") {
		return Plan{}, fmt.Errorf("nvidia-ctk is not installed (apt-get install nvidia-container-toolkit)")
	}
	var p Plan
	var d toolkitPlan
	if b.CDI {
		rows, err := smiQuery(ctx, sys, "gpu", "driver_version")
		if err != nil {
			return Plan{}, err
		}
		version := ""
		if len(rows) > 0 {
			version = rows[0][0]
		}
		spec, err := sys.ReadFile(NvidiaCDIFile)
		switch {
		case isNotExist(err):
			p.Changes = append(p.Changes, "nvidia-ctk cdi generate "+NvidiaCDIFile)
			d.cdi = true
		case err != nil:
			return Plan{}, err
		case version != "" && !strings.Contains(string(spec), version):
			p.Changes = append(p.Changes, "nvidia-ctk cdi generate "+NvidiaCDIFile+" (for driver "+version+")")
			d.cdi = true
		}
	}
	for _, r := range b.Runtimes {
		if !sys.Exists(runtimeDropIns[r][0]) {
			p.Changes = append(p.Changes, "nvidia-ctk runtime configure --runtime="+r+" into "+runtimeDropIns[r][0])
			d.runtimes = append(d.runtimes, r)
		}
	}
	p.Detail = d
	return p, nil
}

func (c ContainerToolkit) Apply(ctx context.Context, sys System, _ json.RawMessage, p Plan) error {
	d, ok := p.Detail.(toolkitPlan)
	if !ok {
		return fmt.Errorf("container-toolkit: no plan")
	}
	if d.cdi {
		if _, err := sys.Run(ctx, "nvidia-ctk", "cdi", "generate", "--output="+NvidiaCDIFile); err != nil {
			return err
		}
	}
	for _, r := range d.runtimes {
		if _, err := sys.Run(ctx, "nvidia-ctk", "runtime", "configure", "--runtime="+r, "--config="+runtimeDropIns[r][0]); err != nil {
			return err
		}
		if _, active, _, err := serviceState(ctx, sys, runtimeDropIns[r][1]); err == nil && active == "active" {
			if _, err := sys.Run(ctx, "systemctl", "restart", runtimeDropIns[r][1]); err != nil {
				return err
			}
		}
	}
	return nil
}
