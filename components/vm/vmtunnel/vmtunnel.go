// Package vmtunnel gives instance tickets their targets
// (tunnel.Instances): a tunnel's addresses are the instance's own as the
// loaded network policy binds them (netguard), only while the runtime
// lists the instance's domain as bcd's and running; its console is the
// serial console the runtime opens. docs/instances.md, "Tunnels into
// instances".
package vmtunnel

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Targets implements tunnel.Instances.
type Targets struct {
	// Guard gives a running instance's addresses under the loaded tables
	// (netguard.Guard; nil: no instance has an address to dial).
	Guard interface{ Addresses(id string) []netip.Addr }
	// List lists the runtime's domains (vmruntime.Runtime.List).
	List func(ctx context.Context) ([]vmruntime.Domain, error)
	// OpenConsole opens the serial console of a running domain bcd owns
	// (nil: this runtime opens none).
	OpenConsole func(ctx context.Context, id string) (*os.File, error)
}

var _ tunnel.Instances = Targets{}

// running refuses an instance the runtime does not list as a domain of
// bcd's in one of states.
func (t Targets) running(ctx context.Context, id string, states ...string) error {
	if t.List == nil {
		return errors.New("this node runs no instance runtime")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ds, err := t.List(ctx)
	if err != nil {
		return fmt.Errorf("listing the runtime's domains: %w", err)
	}
	for _, d := range ds {
		if d.ID != id {
			continue
		}
		if !d.Owned {
			return fmt.Errorf("instance %s is a domain bcd did not create (never touched)", id)
		}
		if !slices.Contains(states, d.State) {
			return fmt.Errorf("instance %s is %s, not running", id, d.State)
		}
		return nil
	}
	return fmt.Errorf("instance %s is not on this node", id)
}

// Addresses are instance id's addresses under the loaded tables, IPv4
// first, once the runtime lists it running: the tunnel dials them in
// that order until one answers.
func (t Targets) Addresses(ctx context.Context, id string) ([]netip.Addr, error) {
	if err := t.running(ctx, id, vmruntime.Running); err != nil {
		return nil, err
	}
	if t.Guard == nil {
		return nil, errors.New("this node loads no network policy, so no instance address is trusted")
	}
	as := t.Guard.Addresses(id)
	if len(as) == 0 {
		return nil, fmt.Errorf("instance %s has no address the loaded network policy binds (no NIC with addresses, its policy failed, or the tables are being loaded again)", id)
	}
	return as, nil
}

// Console opens instance id's serial console once the runtime lists it
// running (or paused: a console may be open before it resumes).
func (t Targets) Console(ctx context.Context, id string) (tunnel.Target, error) {
	if t.OpenConsole == nil {
		return nil, errors.New("this node's runtime opens no serial console")
	}
	if err := t.running(ctx, id, vmruntime.Running, vmruntime.Paused); err != nil {
		return nil, err
	}
	f, err := t.OpenConsole(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("instance %s's serial console: %w", id, err)
	}
	return tunnel.TTYTarget(f), nil
}
