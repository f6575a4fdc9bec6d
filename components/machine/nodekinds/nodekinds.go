// Package nodekinds holds the node role's v0.1 command kinds over a
// Hardware seam: inventory.refresh, diag.nvml and gpu.reset. The host
// build reads the real machine (procfs, sysfs, nvidia-smi); a fakehw build
// passes a fake machine. With [helper] (bcd node unprivileged), the real
// machine's GPU resets go through bcd helper (WithHelper).
package nodekinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/xid"
)

// Hardware is what the node kinds read and act on.
type Hardware interface {
	// Inventory collects and seals the machine's inventory.
	Inventory(ctx context.Context) (*inventory.Inventory, error)
	// SMI runs nvidia-smi; nil when the machine has none.
	SMI() nvsmi.Runner
	// XIDs are this boot's NVIDIA Xid errors.
	XIDs(ctx context.Context) ([]nvsmi.XID, error)
	// ResetGPU resets one GPU.
	ResetGPU(ctx context.Context, g nvsmi.GPU) error
}

// Holds reports whether a GPU (by UUID) has a live device hold; a held GPU
// is never reset. Holds arrive with the devices section of the desired
// state; until then nil means none.
type Holds func(uuid string) bool

// Kinds returns the node kinds over hw.
func Kinds(hw Hardware, holds Holds) []dispatch.Kind {
	if holds == nil {
		holds = func(string) bool { return false }
	}
	return []dispatch.Kind{
		{Name: "inventory.refresh", Idempotent: true, Resources: fixed("inventory"), Run: refresh(hw)},
		{Name: "diag.nvml", Idempotent: true, Run: diagNVML(hw)},
		{Name: "gpu.reset", Resources: gpuResource, Run: gpuReset(hw, holds)},
	}
}

func fixed(r string) func([]byte) ([]string, error) {
	return func([]byte) ([]string, error) { return []string{r}, nil }
}

func refresh(hw Hardware) func(context.Context, []byte) (json.RawMessage, error) {
	return func(ctx context.Context, _ []byte) (json.RawMessage, error) {
		inv, err := hw.Inventory(ctx)
		if err != nil {
			return nil, fmt.Errorf("collect inventory: %w", err)
		}
		return json.Marshal(inv)
	}
}

// DiagResult is diag.nvml's output.
type DiagResult struct {
	Pass     bool            `json:"pass"`
	Driver   string          `json:"driver,omitempty"`
	GPUs     int             `json:"gpus"`
	Findings []nvsmi.Finding `json:"findings"`
}

func diagNVML(hw Hardware) func(context.Context, []byte) (json.RawMessage, error) {
	return func(ctx context.Context, _ []byte) (json.RawMessage, error) {
		res := DiagResult{Pass: true}
		j := Health(ctx, hw)
		init := nvsmi.Finding{Check: "nvml.init", Pass: true, Status: nvsmi.StatusPass}
		if j.CollectErr != nil && len(j.GPUs) == 0 {
			init.Pass, init.Status, init.Reason = false, nvsmi.StatusFail, j.CollectErr.Error()
		}
		res.Findings = append(res.Findings, init)
		if j.XIDErr != nil {
			res.Findings = append(res.Findings, nvsmi.Finding{Check: "xid.read", Status: nvsmi.StatusFail, Reason: j.XIDErr.Error()})
		}
		for _, g := range j.GPUs {
			if res.Driver == "" {
				res.Driver = g.DriverVersion
			}
		}
		res.Findings = append(res.Findings, j.Findings...)
		res.GPUs = len(j.GPUs)
		var failed []string
		for _, f := range res.Findings {
			if f.Status == nvsmi.StatusFail {
				res.Pass = false
				failed = append(failed, strings.TrimSpace(f.GPU+" "+f.Check+": "+f.Reason))
			}
		}
		out, merr := json.Marshal(res)
		if merr != nil {
			return nil, merr
		}
		if !res.Pass {
			return out, fmt.Errorf("%d checks failed: %s", len(failed), strings.Join(failed, "; "))
		}
		return out, nil
	}
}

type gpuBody struct {
	GPU string `json:"gpu"` // UUID, PCI bus id or index
}

func parseGPUBody(b []byte) (gpuBody, error) {
	var body gpuBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return body, err
	}
	if body.GPU == "" {
		return body, errors.New(`body: "gpu" (UUID, PCI bus id or index) is required`)
	}
	return body, nil
}

func gpuResource(b []byte) ([]string, error) {
	body, err := parseGPUBody(b)
	if err != nil {
		return nil, err
	}
	return []string{"gpu:" + strings.ToLower(body.GPU)}, nil
}

func findGPU(gpus []nvsmi.GPU, id string) (nvsmi.GPU, bool) {
	for _, g := range gpus {
		if strings.EqualFold(g.UUID, id) || nvsmi.NormalizeBusID(g.PCIBusID) == nvsmi.NormalizeBusID(id) || fmt.Sprint(g.Index) == id {
			return g, true
		}
	}
	return nvsmi.GPU{}, false
}

// ResetResult is gpu.reset's output: the GPU's health read back.
type ResetResult struct {
	GPU      string          `json:"gpu"`
	Healthy  bool            `json:"healthy"`
	Findings []nvsmi.Finding `json:"findings"`
}

func gpuReset(hw Hardware, holds Holds) func(context.Context, []byte) (json.RawMessage, error) {
	return func(ctx context.Context, b []byte) (json.RawMessage, error) {
		body, err := parseGPUBody(b)
		if err != nil {
			return nil, err
		}
		run := hw.SMI()
		if run == nil {
			return nil, nvsmi.ErrNotFound
		}
		gpus, err := nvsmi.Collect(ctx, run)
		if len(gpus) == 0 {
			return nil, fmt.Errorf("list GPUs: %w", err)
		}
		g, ok := findGPU(gpus, body.GPU)
		if !ok {
			return nil, fmt.Errorf("no GPU %q on this node", body.GPU)
		}
		if holds(g.UUID) {
			return nil, fmt.Errorf("GPU %s has a live hold; release it before a reset", g.UUID)
		}
		if err := hw.ResetGPU(ctx, g); err != nil {
			return nil, fmt.Errorf("reset GPU %s: %w", g.UUID, err)
		}
		// Read the health back: the reset is done only when the GPU answers.
		after := Health(ctx, hw)
		g2, ok := findGPU(after.GPUs, g.UUID)
		if !ok {
			return nil, fmt.Errorf("GPU %s did not come back after the reset: %v", g.UUID, after.CollectErr)
		}
		res := ResetResult{GPU: g.UUID, Healthy: true, Findings: Of(after.Findings, g2)}
		for _, f := range res.Findings {
			if f.Status == nvsmi.StatusFail {
				res.Healthy = false
			}
		}
		out, _ := json.Marshal(res)
		if !res.Healthy {
			return out, fmt.Errorf("GPU %s is not healthy after the reset", g.UUID)
		}
		return out, nil
	}
}

// Host is the real machine.
type Host struct {
	// NvidiaSMI is the binary ("" finds nvidia-smi on PATH).
	NvidiaSMI string
	// DataDir keeps faults.json: this boot's Xid errors, so a restart in
	// the same boot keeps them until a reset leaves the GPU healthy.
	DataDir string
	// Helper, when set ([helper] in config.toml: bcd node runs
	// unprivileged), does the privileged work: a GPU reset is bcd helper's
	// gpu.reset, which checks the GPU is one of this host's itself.
	Helper *helperclient.Client
}

// WithHelper routes hw's privileged work through bcd helper: the real
// machine's (Host) GPU resets. A fake machine does nothing privileged and
// is returned as it is.
func WithHelper(hw Hardware, c *helperclient.Client) Hardware {
	if h, ok := hw.(Host); ok && c != nil {
		h.Helper = c
		return h
	}
	return hw
}

func (h Host) smiPath() (string, bool) {
	p := h.NvidiaSMI
	if p == "" {
		p = "nvidia-smi"
	}
	full, err := exec.LookPath(p)
	return full, err == nil
}

// SMI returns the nvidia-smi runner, or nil without nvidia-smi.
func (h Host) SMI() nvsmi.Runner {
	p, ok := h.smiPath()
	if !ok {
		return nil
	}
	return nvsmi.ExecRunner(p)
}

// Inventory collects the real machine, its GPUs' links completed from
// sysfs (CompleteLinks).
func (h Host) Inventory(ctx context.Context) (*inventory.Inventory, error) {
	return inventory.Collect(ctx, inventory.Options{SMI: h.SMI(), CompleteGPUs: h.CompleteLinks})
}

// XIDs reads this boot's NVIDIA Xid errors from /dev/kmsg into
// faults.json and returns all of them.
func (h Host) XIDs(ctx context.Context) ([]nvsmi.XID, error) {
	st, err := h.faults()
	if err != nil {
		return nil, err
	}
	evs, rerr := xid.ReadKmsg(ctx)
	if st.Add(evs...) > 0 {
		if err := st.Save(); err != nil {
			return nil, err
		}
	}
	var out []nvsmi.XID
	for _, e := range st.Events() {
		out = append(out, nvsmi.XID{Code: e.Code, PCIBusID: e.PCIBusID, Message: e.Message})
	}
	return out, rerr
}

func (h Host) faults() (*xid.Store, error) {
	boot, err := hostinfo.BootID(h.DataDir)
	if err != nil {
		return nil, err
	}
	return xid.Load(h.DataDir, boot)
}

// ResetGPU runs nvidia-smi -r for the GPU (bounded to 2 minutes), or,
// with Helper set, asks bcd helper to reset it by its UUID.
func (h Host) ResetGPU(ctx context.Context, g nvsmi.GPU) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if h.Helper != nil {
		if err := h.Helper.ResetGPU(ctx, g.UUID); err != nil {
			return err
		}
	} else if err := h.resetHere(ctx, g); err != nil {
		return err
	}
	// The reset clears the GPU's recorded Xid errors.
	if st, err := h.faults(); err == nil && st.Clear(g.PCIBusID) > 0 {
		return st.Save()
	}
	return nil
}

// resetHere runs nvidia-smi -r itself (bcd node runs as root).
func (h Host) resetHere(ctx context.Context, g nvsmi.GPU) error {
	p, ok := h.smiPath()
	if !ok {
		return nvsmi.ErrNotFound
	}
	out, err := exec.CommandContext(ctx, p, "-r", "-i", g.PCIBusID).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nvidia-smi -r -i %s = %w: %s", g.PCIBusID, err, strings.TrimSpace(string(out)))
	}
	return nil
}
