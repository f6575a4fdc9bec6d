// Package section is the node's host section: the config units of
// components/host/unit planned in order against the host, each failing
// alone, applied by bcd node itself when it runs as root or one unit at a
// time through bcd helper's host.unit (with the proof of the signed spec)
// when it runs unprivileged. It keeps each unit's state for bcd status and
// the conditions the units raise (RebootRequired, FabricManagerDown,
// MPSDown) for the report. docs/host.md describes it.
package section

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/trust/rootsig"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Unit states, as bcd status shows them.
const (
	Converged   = "CONVERGED"
	Changing    = "CHANGING"
	Failed      = "FAILED"
	Unsupported = "UNSUPPORTED"
	Off         = "OFF"
)

// Config is what the section needs.
type Config struct {
	// Units are the units the role composes.
	Units *unit.Registry
	// System is the host the units read (and change, when Direct).
	System unit.System
	// Helper applies each unit through host.unit when bcd node runs
	// unprivileged.
	Helper *helperclient.Client
	// Direct applies in this process (bcd node runs as root). Neither:
	// a unit with changes fails as node-unprivileged.
	Direct bool
	// Off is [host] units = false: the section changes nothing.
	Off bool
	// Now is the clock of the conditions' since (default time.Now).
	Now func() time.Time
}

// UnitState is one unit's state after the last pass.
type UnitState struct {
	Name    string   `json:"name"`
	State   string   `json:"state"`
	Message string   `json:"message,omitempty"`
	Changes []string `json:"changes,omitempty"`
}

// Section is the host section.
type Section struct {
	cfg   Config
	proof atomic.Pointer[rootsig.Proof]

	mu    sync.Mutex
	units []UnitState
	conds []unit.Condition
	since map[string]time.Time // a condition's type+message: when first raised
}

// New returns the section.
func New(cfg Config) *Section {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Section{cfg: cfg, since: map[string]time.Time{}}
}

// Name is "host".
func (s *Section) Name() string { return "host" }

// HeldProof keeps the proof of the held spec: the helper applies a unit
// only with it (converge.Proven).
func (s *Section) HeldProof(p rootsig.Proof) { s.proof.Store(&p) }

// Check decodes body strictly: every unit named is one of the registry's
// and its settings check.
func (s *Section) Check(body json.RawMessage) error {
	_, err := s.cfg.Units.DecodeSection(body)
	return err
}

// planned is one unit's plan in a pass.
type planned struct {
	u    unit.Unit
	body json.RawMessage
	p    unit.Plan
	err  error
}

// Plan plans every unit in order. A unit whose plan fails adds a line
// (so the section is not converged) and the rest go on.
func (s *Section) Plan(ctx context.Context, body json.RawMessage) (converge.Plan, error) {
	sec, err := s.cfg.Units.DecodeSection(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	if s.cfg.Off {
		var states []UnitState
		for _, u := range s.cfg.Units.Units() {
			if _, ok := sec[u.Name()]; ok {
				states = append(states, UnitState{Name: u.Name(), State: Off, Message: "[host] units = false: bcd changes nothing on this host"})
			}
		}
		s.set(states, nil)
		return converge.Plan{}, nil
	}
	var (
		plans   []planned
		changes []string
		states  []UnitState
		conds   []unit.Condition
	)
	for _, u := range s.cfg.Units.Units() {
		b := sec[u.Name()]
		p, err := u.Plan(ctx, s.cfg.System, b)
		pl := planned{u: u, body: b, p: p, err: err}
		plans = append(plans, pl)
		conds = append(conds, p.Conditions...)
		st := UnitState{Name: u.Name(), State: Converged}
		switch {
		case err != nil:
			st.State, st.Message = stateOf(err), err.Error()
			changes = append(changes, u.Name()+": "+err.Error())
		case len(p.Changes) > 0:
			st.State, st.Changes = Changing, p.Changes
			for _, c := range p.Changes {
				changes = append(changes, u.Name()+": "+c)
			}
		case b == nil:
			continue // not named, nothing of it left: not shown
		}
		states = append(states, st)
	}
	s.set(states, conds)
	return converge.Plan{Changes: changes, Detail: plans}, nil
}

func stateOf(err error) string {
	if errors.Is(err, unit.ErrUnsupported) {
		return Unsupported
	}
	return Failed
}

// Apply applies every unit with changes, in order, through the helper or
// directly; a unit that fails does not stop the ones after it. The error
// names every unit that failed; it is Terminal when none of them can
// succeed by retrying (invalid or unsupported settings, a refused change).
func (s *Section) Apply(ctx context.Context, body json.RawMessage, p converge.Plan) error {
	plans, ok := p.Detail.([]planned)
	if !ok {
		return errors.New("host: no plan")
	}
	var errs []error
	terminal := true
	for _, pl := range plans {
		err := pl.err
		if err == nil && len(pl.p.Changes) > 0 {
			err = s.apply(ctx, pl, body)
			if err != nil {
				s.failed(pl.u.Name(), err)
			}
		}
		if err == nil {
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %w", pl.u.Name(), err))
		if !final(err) {
			terminal = false
		}
	}
	if len(errs) == 0 {
		return nil
	}
	err := errors.Join(errs...)
	if terminal {
		return converge.Terminal(err)
	}
	return err
}

// final reports whether retrying cannot mend err in this generation.
func final(err error) bool {
	if unit.Final(err) {
		return true
	}
	var he *helperclient.Error
	return errors.As(err, &he) && !helperclient.IsRetryable(err)
}

func (s *Section) apply(ctx context.Context, pl planned, section json.RawMessage) error {
	switch {
	case s.cfg.Helper != nil:
		p := s.proof.Load()
		if p == nil {
			return errors.New("no proof of the held spec yet")
		}
		return s.cfg.Helper.HostUnit(ctx, pl.u.Name(), section, *p)
	case s.cfg.Direct:
		return pl.u.Apply(ctx, s.cfg.System, pl.body, pl.p)
	}
	return fmt.Errorf("%w: node-unprivileged: bcd node runs unprivileged without [helper], so it may not change the host", unit.ErrRefused)
}

func (s *Section) set(states []UnitState, conds []unit.Condition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.units = states
	s.conds = conds
	now := s.cfg.Now()
	keep := map[string]time.Time{}
	for _, c := range conds {
		k := c.Type + "\x00" + c.Message
		if t, ok := s.since[k]; ok {
			keep[k] = t
		} else {
			keep[k] = now
		}
	}
	s.since = keep
}

func (s *Section) failed(name string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.units {
		if s.units[i].Name == name {
			s.units[i].State, s.units[i].Message = stateOf(err), err.Error()
		}
	}
}

// Units answers each unit's state after the last pass, in order (units
// the spec does not name and that left nothing behind are not listed).
func (s *Section) Units() []UnitState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.units)
}

// Conditions answers the conditions the units raised in the last pass,
// for the report (subject: the unit).
func (s *Section) Conditions() []*bcdv1.Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*bcdv1.Condition
	for _, c := range s.conds {
		since := s.since[c.Type+"\x00"+c.Message]
		out = append(out, &bcdv1.Condition{Type: c.Type, Subject: "host", Reason: c.Type, Message: c.Message, SinceUnixMs: since.UnixMilli(), Count: 1})
	}
	return out
}

// Has reports whether a condition of this type is raised now.
func (s *Section) Has(typ string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conds {
		if c.Type == typ {
			return true
		}
	}
	return false
}
