//go:build linux

package helper

import (
	"context"
	"fmt"
	"sync"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// hostMu runs one host.unit at a time: units share the boot loader's
// configuration and the kernel's state.
var hostMu sync.Mutex

// hostUnit is host.unit: one host unit, run as root only from a signed
// spec. Root's own [host] units = false refuses it; the proof and the host
// section go through Admit under root's own anchors (a command-signing
// root root holds, this node, no older than the last host section root
// applied, the section's digest the one signed); then the unit is planned
// again from the section root verified, never from what the node planned,
// and only that unit is applied.
func (srv *server) hostUnit(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	if srv.cfg.HostOff {
		return refused(fmt.Errorf("host.unit refused: root's [host] units = false turns the host section off on this host"))
	}
	units := srv.cfg.HostUnits
	if units == nil || !units.Has(req.ID) {
		return refused(fmt.Errorf("host.unit: %q is not a host unit of this helper", req.ID))
	}
	proof, err := rootsig.DecodeProof(req.Proof)
	if err != nil {
		return refused(fmt.Errorf("host.unit: %w", err))
	}
	hostMu.Lock()
	defer hostMu.Unlock()
	anchors, err := srv.anchors()
	if err != nil {
		return refused(fmt.Errorf("host.unit: %w", err))
	}
	commit, err := anchors.Admit(proof, "host", req.Section)
	if err != nil {
		return refused(fmt.Errorf("host.unit refused: %w", err))
	}
	changed, final, err := units.Apply(ctx, srv.s.root, req.ID, req.Section)
	if err != nil {
		err = fmt.Errorf("host.unit %s: %w", req.ID, err)
		if final {
			return refused(err)
		}
		return failed(err, true)
	}
	if err := commit(); err != nil {
		return failed(fmt.Errorf("host.unit: %w", err), true)
	}
	if len(changed) > 0 {
		srv.log.Info("helper: host.unit", "unit", req.ID, "changed", changed, "generation", proof.Generation)
	}
	return ok()
}
