package nodekinds

import (
	"context"
	"path/filepath"

	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/pcielink"
)

// LinkReader is a Hardware that knows more of its GPUs' PCIe links than
// nvidia-smi does: the slot each GPU sits in and the width it first had
// this boot (Host reads sysfs). A Hardware without it leaves the slot
// unknown, and pcie.link warns rather than fails where it cannot tell.
type LinkReader interface {
	CompleteLinks(gpus []nvsmi.GPU)
}

// Judged is the GPUs of a machine and the verdicts of every check on them.
type Judged struct {
	GPUs     []nvsmi.GPU
	Findings []nvsmi.Finding
	// CollectErr is nvidia-smi's error (the GPUs may still be there, with
	// a part missing); XIDErr the kernel log's.
	CollectErr, XIDErr error
}

// Health reads the GPUs through nvidia-smi, completes their links and
// judges them. It is the one path to the GPUs' verdicts: diag.nvml,
// gpu.reset's read-back, bcd doctor's gpu lines, bcd status's UNHEALTHY
// and bcd hardware --json all take it (hardware and the health monitor
// through Judge, on the GPUs their inventory already holds).
func Health(ctx context.Context, hw Hardware) Judged {
	var j Judged
	run := hw.SMI()
	if run == nil {
		j.CollectErr = nvsmi.ErrNotFound
		return j
	}
	j.GPUs, j.CollectErr = nvsmi.Collect(ctx, run)
	if lr, ok := hw.(LinkReader); ok {
		lr.CompleteLinks(j.GPUs)
	}
	j.Findings, j.XIDErr = Judge(ctx, hw, j.GPUs)
	return j
}

// Judge runs every check on gpus with this boot's XIDs from hw.
func Judge(ctx context.Context, hw Hardware, gpus []nvsmi.GPU) ([]nvsmi.Finding, error) {
	xids, err := hw.XIDs(ctx)
	return nvsmi.CheckAll(gpus, xids), err
}

// Of returns the findings of the GPU named id (UUID or PCI address).
func Of(fs []nvsmi.Finding, g nvsmi.GPU) []nvsmi.Finding {
	id := g.UUID
	if id == "" {
		id = g.PCIBusID
	}
	var out []nvsmi.Finding
	for _, f := range fs {
		if f.GPU == id {
			out = append(out, f)
		}
	}
	return out
}

// CompleteLinks reads each GPU's slot from /sys and records the width
// first seen this boot in data_dir/pcie-first.json.
func (h Host) CompleteLinks(gpus []nvsmi.GPU) {
	pcielink.Apply("/", gpus)
	if h.DataDir == "" {
		return
	}
	boot, err := hostinfo.BootID(h.DataDir)
	if err != nil {
		return
	}
	// A file that does not parse is replaced; the widths of this reading
	// stand meanwhile.
	_ = pcielink.First(filepath.Join(h.DataDir, "pcie-first.json"), boot, gpus)
}
