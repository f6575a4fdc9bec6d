package unit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// GPUSharing is gpu-sharing: one NVIDIA MPS control daemon per named GPU
// set, each a systemd service bcd owns
// (/etc/systemd/system/bcd-mps-<name>.service) with its GPUs in
// CUDA_VISIBLE_DEVICES and its pipe directory /run/bcd-mps/<name>; the
// service starts it at boot. A daemon that is not running raises MPSDown.
type GPUSharing struct{}

// GPUSharingBody is gpu-sharing's settings.
type GPUSharingBody struct {
	MPS []MPSSet `json:"mps"`
}

// MPSSet is one MPS control daemon and its GPUs.
type MPSSet struct {
	Name string   `json:"name"`
	GPUs []string `json:"gpus"`
}

// MPSService is the service of a set.
func MPSService(name string) string { return "bcd-mps-" + name + ".service" }

func mpsFile(name string) string { return "/etc/systemd/system/" + MPSService(name) }

func (GPUSharing) Name() string { return "gpu-sharing" }

func (g GPUSharing) decode(body json.RawMessage) (GPUSharingBody, error) {
	var b GPUSharingBody
	if err := decode(body, &b); err != nil {
		return b, err
	}
	names, gpus := map[string]bool{}, map[string]bool{}
	for _, s := range b.MPS {
		if !isMPSName(s.Name) || names[s.Name] {
			return b, invalid("mps name %q is not [a-z0-9_], 1 to 32, or is given twice", clip(s.Name))
		}
		names[s.Name] = true
		if len(s.GPUs) == 0 || len(s.GPUs) > 64 {
			return b, invalid("mps %s: 1 to 64 GPUs", s.Name)
		}
		for _, u := range s.GPUs {
			if !isGPUUUID(u) || gpus[strings.ToLower(u)] {
				return b, invalid("mps %s: gpu %q is not a GPU-<uuid>, or is in two sets", s.Name, clip(u))
			}
			gpus[strings.ToLower(u)] = true
		}
	}
	return b, nil
}

func (g GPUSharing) Check(body json.RawMessage) error { _, err := g.decode(body); return err }

func (g GPUSharing) render(s MPSSet) string {
	return header(g.Name()) + `[Unit]
Description=bcd: NVIDIA MPS control daemon ` + s.Name + `

[Service]
Environment=CUDA_VISIBLE_DEVICES=` + strings.Join(s.GPUs, ",") + `
Environment=CUDA_MPS_PIPE_DIRECTORY=/run/bcd-mps/` + s.Name + `
Environment=CUDA_MPS_LOG_DIRECTORY=/var/log/bcd-mps/` + s.Name + `
RuntimeDirectory=bcd-mps/` + s.Name + `
LogsDirectory=bcd-mps/` + s.Name + `
ExecStart=/usr/bin/nvidia-cuda-mps-control -f
Restart=on-failure

[Install]
WantedBy=multi-user.target
`
}

type sharingPlan struct {
	write  map[string]string // set name to the file's content
	start  []string          // services to (re)start
	remove []string          // set names no longer asked for
}

func (g GPUSharing) Plan(ctx context.Context, sys System, body json.RawMessage) (Plan, error) {
	b, err := g.decode(body)
	if err != nil {
		return Plan{}, err
	}
	var p Plan
	d := sharingPlan{write: map[string]string{}}
	var wanted []string
	if len(b.MPS) > 0 {
		if !sys.Has("nvidia-cuda-mps-control") {
			return Plan{Conditions: []Condition{{MPSDown, "gpu-sharing: nvidia-cuda-mps-control is not installed"}}},
				fmt.Errorf("nvidia-cuda-mps-control is not installed (the NVIDIA driver's MPS tools)")
		}
		var all []string
		for _, s := range b.MPS {
			all = append(all, s.GPUs...)
		}
		if err := checkGPUs(ctx, sys, all); err != nil {
			return Plan{}, err
		}
	}
	for _, s := range b.MPS {
		wanted = append(wanted, s.Name)
		content := g.render(s)
		c, err := syncFile(sys, mpsFile(s.Name), content)
		if err != nil {
			return Plan{}, err
		}
		if c != "" {
			p.Changes = append(p.Changes, c)
			d.write[s.Name] = content
		}
		_, active, enabled, err := serviceState(ctx, sys, MPSService(s.Name))
		if err != nil {
			return Plan{}, err
		}
		if active != "active" && c == "" {
			p.Conditions = append(p.Conditions, Condition{MPSDown, fmt.Sprintf("gpu-sharing: %s is %s", MPSService(s.Name), or(active, "unknown"))})
		}
		if c != "" || active != "active" || enabled != "enabled" {
			p.Changes = append(p.Changes, "systemctl enable "+MPSService(s.Name)+" and (re)start it")
			d.start = append(d.start, MPSService(s.Name))
		}
	}
	for _, f := range sys.Glob("/etc/systemd/system/bcd-mps-*.service") {
		name := strings.TrimSuffix(strings.TrimPrefix(f, "/etc/systemd/system/bcd-mps-"), ".service")
		if !slices.Contains(wanted, name) {
			p.Changes = append(p.Changes, "stop "+MPSService(name)+" and remove "+f)
			d.remove = append(d.remove, name)
		}
	}
	p.Detail = d
	return p, nil
}

func (g GPUSharing) Apply(ctx context.Context, sys System, _ json.RawMessage, p Plan) error {
	d, ok := p.Detail.(sharingPlan)
	if !ok {
		return fmt.Errorf("gpu-sharing: no plan")
	}
	for _, name := range d.remove {
		if _, err := sys.Run(ctx, "systemctl", "disable", "--now", MPSService(name)); err != nil {
			return err
		}
		if err := sys.RemoveFile(mpsFile(name)); err != nil {
			return err
		}
	}
	for name, content := range d.write {
		if err := sys.WriteFile(mpsFile(name), []byte(content)); err != nil {
			return err
		}
	}
	if len(d.write) > 0 || len(d.remove) > 0 {
		if _, err := sys.Run(ctx, "systemctl", "daemon-reload"); err != nil {
			return err
		}
	}
	for _, svc := range d.start {
		if _, err := sys.Run(ctx, "systemctl", "enable", svc); err != nil {
			return err
		}
		if _, err := sys.Run(ctx, "systemctl", "restart", svc); err != nil {
			return err
		}
	}
	return nil
}
