package fakehw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// Hardware is the fake machine as the node kinds see it. Tests inject
// faults through files under DataDir/fakehw: xids.json (a JSON list of
// nvsmi.XID) is this boot's Xid errors; a GPU reset clears that GPU's
// and is logged to gpu-resets.log.
type Hardware struct {
	Seed    int64
	DataDir string
}

func (h Hardware) dir() string { return filepath.Join(h.DataDir, "fakehw") }

// Inventory is Machine(Seed).
func (h Hardware) Inventory(context.Context) (*inventory.Inventory, error) {
	return Machine(h.Seed), nil
}

// SMI answers like nvidia-smi on the fake machine.
func (h Hardware) SMI() nvsmi.Runner { return NvidiaSMI(h.Seed) }

// XIDs reads the injected Xid errors.
func (h Hardware) XIDs(context.Context) ([]nvsmi.XID, error) {
	b, err := os.ReadFile(filepath.Join(h.dir(), "xids.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var x []nvsmi.XID
	if err := json.Unmarshal(b, &x); err != nil {
		return nil, fmt.Errorf("fakehw xids.json: %w", err)
	}
	return x, nil
}

// ResetGPU logs the reset and clears the GPU's injected Xid errors.
func (h Hardware) ResetGPU(ctx context.Context, g nvsmi.GPU) error {
	if err := os.MkdirAll(h.dir(), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(h.dir(), "gpu-resets.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %s %d\n", g.UUID, g.PCIBusID, time.Now().UnixMilli())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	x, err := h.XIDs(ctx)
	if err != nil || len(x) == 0 {
		return err
	}
	keep := x[:0]
	for _, e := range x {
		if e.UUID != g.UUID && nvsmi.NormalizeBusID(e.PCIBusID) != nvsmi.NormalizeBusID(g.PCIBusID) {
			keep = append(keep, e)
		}
	}
	b, _ := json.Marshal(keep)
	return os.WriteFile(filepath.Join(h.dir(), "xids.json"), b, 0o600)
}
