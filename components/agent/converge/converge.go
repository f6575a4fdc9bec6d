// Package converge is the desired-state half of an agent: it holds the
// NodeSpec the gateway sent (full, or an RFC 7396 merge patch onto the
// generation it holds), stored fsynced in data_dir so it is enforced
// offline, and converges the machine toward it section by section in the
// fixed order of components/base/nodespec.
//
// Each section is a Section the role's main composes: Check decodes its
// body strictly (an invalid body refuses the whole spec, the held one
// unchanged), Plan says what differs, Apply changes it, idempotently. A
// section the spec names but the role lacks is UNSUPPORTED. A failing
// section never holds back the ones after it: a retryable failure is
// tried again with back-off (RETRYING), a Terminal one stays FAILED for
// its generation. The observed generation advances, and is stored, only
// when every section has converged or failed terminally, so it never runs
// ahead of what was applied, across crashes too. A pass runs on every new
// spec, on Kick, while a section is PROGRESSING or RETRYING, and every
// Repair interval to mend drift. docs/nodespec.md describes the sections.
package converge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/rootsig"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Section states, as StatusReport.section_states and bcd status show them.
const (
	Converged   = "CONVERGED"
	Progressing = "PROGRESSING"
	Retrying    = "RETRYING"
	Failed      = "FAILED"
	Unsupported = "UNSUPPORTED"
)

// Files under data_dir.
const (
	SpecFile     = "spec.json"
	ObservedFile = "converge.json"
)

// Section is one NodeSpec section a role converges. body is the section's
// JSON, or nil when the spec has none (nothing desired: a section then
// undoes what it made).
type Section interface {
	Name() string
	// Check decodes body strictly (unknown fields and wrong types are
	// errors) without touching the machine.
	Check(body json.RawMessage) error
	// Plan compares the machine with body; no changes means converged.
	Plan(ctx context.Context, body json.RawMessage) (Plan, error)
	// Apply makes the changes Plan found. An error is retried with
	// back-off unless it is Terminal. Apply is idempotent: when it starts
	// work that finishes in the background, the section stays PROGRESSING
	// and later passes plan and apply it again (finding the work under
	// way) until Plan finds nothing left to change.
	Apply(ctx context.Context, body json.RawMessage, p Plan) error
}

// Plan is what a section would change, one line per change.
type Plan struct {
	Changes []string
	// Detail is the section's own plan, handed back to its Apply in the
	// same pass, so Apply need not read the machine again.
	Detail any
}

// DecodeSection decodes a section body strictly into v: one JSON value,
// no unknown fields, nothing after it. A nil body (no such section in the
// spec) leaves v as it is. Sections decode their Check with it.
func DecodeSection(body json.RawMessage, v any) error {
	if body == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the section's JSON value")
	}
	return nil
}

// Fresh is a Section that must know when its body arrived from the
// gateway (a boot lease, whose expiry is read against the clock at
// arrival), told before each of its passes.
type Fresh interface {
	Arrived(gen uint64, a Arrival)
}

// Evented is a Section that records events (AllocationBound...): the
// engine gives it the agent's event log at Open.
type Evented interface {
	SetEvent(func(typ string, body any))
}

// Arrival says when the held generation arrived. Fresh is false when it
// was loaded from data_dir after a restart (what it said about time is
// then stale: a boot lease is not held again until the gateway says so).
type Arrival struct {
	Fresh bool
	// ServerNow is the working clock (gateway time) on arrival, Local
	// the local clock (with its monotonic reading).
	ServerNow, Local time.Time
}

type terminal struct{ err error }

func (t terminal) Error() string { return t.err.Error() }
func (t terminal) Unwrap() error { return t.err }

// Terminal marks err as a failure that retrying will not mend for this
// generation (a GPU that is not there, a limit beyond the host's).
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return terminal{err}
}

// IsTerminal reports whether err was marked Terminal.
func IsTerminal(err error) bool {
	var t terminal
	return errors.As(err, &t)
}

// Config configures an Engine.
type Config struct {
	DataDir  string
	Sections []Section
	Log      *slog.Logger
	// Repair is the interval of the pass that mends drift (default 10 min).
	Repair time.Duration
	// RetryBase and RetryMax shape retries of failed sections (default
	// 1 s and 5 min, full jitter); Recheck bounds the wait of a
	// PROGRESSING section (default 5 s).
	RetryBase, RetryMax, Recheck time.Duration
	// Changed, when set, is called (never concurrently) after the status
	// changed: a new spec, a refusal, a section's new state.
	Changed func()
	// Event, when set, records an event for the gateway (a section that
	// failed, a refused spec).
	Event func(typ string, body any)
	// Now is the working clock (gateway time); default time.Now.
	Now func() time.Time
	// Verify, when set, checks a DesiredState's signature (signed intent)
	// once the full spec it makes is known (the signature covers its
	// sections); its error refuses it, the held spec unchanged.
	Verify func(ds *bcdv1.DesiredState, full nodespec.Spec) error
	// NodeID is the agent's node id, named in the proof of the held spec
	// that Proven sections show bcd helper.
	NodeID string
	// Bundle, when set, is the trust bundle the agent holds, handed to
	// Proven sections with the proof (nil: none held).
	Bundle func() *rootsig.Bundle
}

// Proven is a Section that has root apply what it holds (through bcd
// helper), which takes a section only with the signature of the spec it
// came in: the engine gives it the proof of the held generation before
// each of its passes (its signature empty when the spec came unsigned).
type Proven interface {
	HeldProof(p rootsig.Proof)
}

// SectionState is one section's state.
type SectionState struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	Generation uint64    `json:"generation"`
	Message    string    `json:"message,omitempty"`
	Changes    []string  `json:"changes,omitempty"`
	Since      time.Time `json:"since"`
	Attempts   int       `json:"attempts,omitempty"`
	// next is when a RETRYING or PROGRESSING section runs again.
	next time.Time
}

// Status is what the engine reports.
type Status struct {
	Applied  uint64         `json:"applied_generation"`
	Observed uint64         `json:"observed_generation"`
	Sections []SectionState `json:"sections"`
	// SpecError says why the last DesiredState was refused, for
	// RefusedGeneration; WantFull asks the gateway for the full spec.
	SpecError         string `json:"spec_error,omitempty"`
	RefusedGeneration uint64 `json:"refused_generation,omitempty"`
	WantFull          bool   `json:"want_full_spec,omitempty"`
}

// held is the stored spec.
type held struct {
	Generation uint64          `json:"generation"`
	Spec       json.RawMessage `json:"spec"`
	// Proof is the signed fields of the frame that made the spec, for
	// bcd helper (none in a spec stored before proofs were kept).
	Proof *rootsig.Proof `json:"proof,omitempty"`
}

// Engine converges one agent's machine toward its held spec.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	sections map[string]Section
	kick     chan struct{}
	// passMu serializes passes with each other.
	passMu sync.Mutex

	mu       sync.Mutex
	gen      uint64
	spec     nodespec.Spec
	raw      []byte // spec as stored (canonical)
	proof    rootsig.Proof
	observed uint64
	states   map[string]*SectionState
	refused  struct {
		gen      uint64
		err      string
		wantFull bool
	}
	// repairing: the next pass also re-runs sections that FAILED in this
	// generation (the repair interval ran out).
	repairing bool
	// arrived is when the last spec taken in this process came, and
	// arrivedGen its generation (0: none yet, the held one was loaded).
	arrivedGen uint64
	arrived    Arrival
}

// Open loads the held spec and observed generation from cfg.DataDir. A
// stored spec that no longer checks (a newer build wrote it, or it was
// damaged) is kept on disk aside and the engine starts with none.
func Open(cfg Config) (*Engine, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Repair <= 0 {
		cfg.Repair = 10 * time.Minute
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = time.Second
	}
	if cfg.RetryMax <= 0 {
		cfg.RetryMax = 5 * time.Minute
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	e := &Engine{cfg: cfg, log: cfg.Log.With("component", "converge"), sections: map[string]Section{},
		kick: make(chan struct{}, 1), states: map[string]*SectionState{}, spec: nodespec.Spec{}}
	for _, s := range cfg.Sections {
		if !nodespec.Known(s.Name()) {
			return nil, fmt.Errorf("converge: section %q is not in the NodeSpec's sections %v", s.Name(), nodespec.Order)
		}
		if e.sections[s.Name()] != nil {
			return nil, fmt.Errorf("converge: section %q given twice", s.Name())
		}
		e.sections[s.Name()] = s
		if ev, ok := s.(Evented); ok && cfg.Event != nil {
			ev.SetEvent(cfg.Event)
		}
	}
	if cfg.DataDir == "" {
		return e, nil
	}
	b, err := os.ReadFile(filepath.Join(cfg.DataDir, SpecFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("converge: %w", err)
	default:
		var h held
		var spec nodespec.Spec
		if err = json.Unmarshal(b, &h); err == nil {
			spec, err = e.check(h.Spec)
		}
		if err != nil {
			aside := filepath.Join(cfg.DataDir, SpecFile+".bad")
			_ = os.Rename(filepath.Join(cfg.DataDir, SpecFile), aside)
			e.log.Error("the stored spec does not check; moved aside, holding none until the gateway sends one", "moved_to", aside, "err", err)
			break
		}
		e.gen, e.spec, e.raw = h.Generation, spec, spec.Encode()
		if h.Proof != nil {
			e.proof = *h.Proof
		}
	}
	var o struct {
		Observed uint64 `json:"observed_generation"`
	}
	if b, err := os.ReadFile(filepath.Join(cfg.DataDir, ObservedFile)); err == nil && json.Unmarshal(b, &o) == nil && o.Observed <= e.gen {
		e.observed = o.Observed
	}
	return e, nil
}

// check decodes a full spec and checks every section the role has.
func (e *Engine) check(b []byte) (nodespec.Spec, error) {
	spec, err := nodespec.Decode(b)
	if err != nil {
		return nil, err
	}
	return spec, e.checkSections(spec)
}

func (e *Engine) checkSections(spec nodespec.Spec) error {
	for _, name := range nodespec.Order {
		s := e.sections[name]
		if s == nil {
			continue
		}
		if err := s.Check(spec[name]); err != nil {
			return fmt.Errorf("section %s: %w", name, err)
		}
	}
	return nil
}

// Applied is the generation of the held spec; Observed the generation
// every section last converged or failed terminally at.
func (e *Engine) Applied() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// Observed is the generation every section last settled at.
func (e *Engine) Observed() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.observed
}

// Offer takes a DesiredState from the gateway, received when the working
// clock read serverNow. A spec that checks is stored (fsync) before Offer
// returns and a pass is started; a refused one leaves the held spec as it
// was and is reported. It returns the refusal, if any.
func (e *Engine) Offer(ds *bcdv1.DesiredState, serverNow time.Time) error {
	err := e.offer(ds, serverNow)
	if err != nil {
		e.log.Warn("desired state refused; holding the spec before it", "generation", ds.GetGeneration(), "patch", ds.GetPatch(), "err", err)
		if e.cfg.Event != nil {
			e.cfg.Event("spec.refused", map[string]any{"generation": ds.GetGeneration(), "error": err.Error()})
		}
	}
	e.changed()
	return err
}

// errStale is a DesiredState for a generation the agent already holds or
// passed: ignored, not refused.
var errStale = errors.New("stale")

func (e *Engine) offer(ds *bcdv1.DesiredState, serverNow time.Time) error {
	e.mu.Lock()
	gen, heldRaw := e.gen, e.raw
	e.mu.Unlock()
	g := ds.GetGeneration()
	if g == 0 {
		return e.refuse(g, "a DesiredState without a generation", false)
	}
	if g <= gen {
		// A resend after a redial, or a gateway behind this agent.
		e.log.Info("desired state for a generation already held; ignored", "generation", g, "held", gen)
		return nil
	}
	var spec nodespec.Spec
	var err error
	if ds.GetPatch() {
		if ds.GetBaseGeneration() != gen {
			return e.refuse(g, fmt.Sprintf("a patch onto generation %d, but this agent holds generation %d: asking for the full spec", ds.GetBaseGeneration(), gen), true)
		}
		spec, err = nodespec.Merge(heldRaw, ds.GetSpec())
	} else {
		spec, err = nodespec.Decode(ds.GetSpec())
	}
	if err != nil {
		return e.refuse(g, err.Error(), false)
	}
	// The signature first (it covers the full spec's sections), then what
	// the sections make of their bodies.
	if e.cfg.Verify != nil {
		if err := e.cfg.Verify(ds, spec); err != nil {
			return e.refuse(g, err.Error(), false)
		}
	}
	if err := e.checkSections(spec); err != nil {
		return e.refuse(g, err.Error(), false)
	}
	proof, err := intent.DesiredStateProof(e.cfg.NodeID, ds, spec)
	if err != nil {
		return e.refuse(g, err.Error(), false)
	}
	raw := spec.Encode()
	if err := e.store(g, raw, proof); err != nil {
		// Not held: the gateway sends it again after the next Welcome.
		return e.refuse(g, "storing the spec: "+err.Error(), false)
	}
	e.mu.Lock()
	e.gen, e.spec, e.raw, e.proof = g, spec, raw, proof
	e.refused.gen, e.refused.err, e.refused.wantFull = 0, "", false
	e.arrivedGen, e.arrived = g, Arrival{ServerNow: serverNow, Local: time.Now()}
	e.mu.Unlock()
	e.log.Info("desired state held", "generation", g, "patch", ds.GetPatch(), "bytes", len(raw))
	e.Kick()
	return nil
}

func (e *Engine) refuse(gen uint64, why string, wantFull bool) error {
	e.mu.Lock()
	e.refused.gen, e.refused.err, e.refused.wantFull = gen, why, wantFull
	e.mu.Unlock()
	return errors.New(why)
}

// store writes the held spec (fsync) before anything applies it.
func (e *Engine) store(gen uint64, raw []byte, proof rootsig.Proof) error {
	if e.cfg.DataDir == "" {
		return nil
	}
	b, err := json.Marshal(held{Generation: gen, Spec: raw, Proof: &proof})
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(e.cfg.DataDir, SpecFile), b, 0o600)
}

// Kick asks for a pass now (a section's background work finished, or an
// operator asked).
func (e *Engine) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

func (e *Engine) changed() {
	if e.cfg.Changed != nil {
		e.cfg.Changed()
	}
}

// Run converges until ctx ends: a pass at start (the stored spec is
// enforced without a gateway), then on every Kick, when a section is due
// again, and every Repair interval.
func (e *Engine) Run(ctx context.Context) error {
	repair := time.NewTimer(e.cfg.Repair)
	defer repair.Stop()
	for {
		next := e.Pass(ctx)
		var due <-chan time.Time
		var t *time.Timer
		if !next.IsZero() {
			t = time.NewTimer(max(time.Until(next), 0))
			due = t.C
		}
		var repairNow bool
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return nil
		case <-e.kick:
		case <-due:
		case <-repair.C:
			repairNow = true
		}
		if t != nil {
			t.Stop()
		}
		if repairNow {
			e.log.Info("repair pass")
			repair.Reset(e.cfg.Repair)
			e.mu.Lock()
			e.repairing = true
			for _, st := range e.states {
				st.next = time.Time{}
			}
			e.mu.Unlock()
		}
	}
}

// Pass runs every section once in the fixed order, except a RETRYING one
// whose back-off has not run out, and returns when the next pass is due
// (zero: only on a kick or the repair interval).
func (e *Engine) Pass(ctx context.Context) time.Time {
	e.passMu.Lock()
	defer e.passMu.Unlock()
	e.mu.Lock()
	gen, spec, proof := e.gen, e.spec, e.proof
	arrivedGen, arrived := e.arrivedGen, e.arrived
	repairing := e.repairing
	e.repairing = false
	e.mu.Unlock()
	settled := true
	changed := false
	var next time.Time
	for _, name := range nodespec.Order {
		body := spec[name]
		s := e.sections[name]
		var st SectionState
		switch {
		case s == nil && body == nil:
			e.mu.Lock()
			if e.states[name] != nil {
				delete(e.states, name)
				changed = true
			}
			e.mu.Unlock()
			continue
		case s == nil:
			st = SectionState{Name: name, State: Unsupported, Generation: gen, Message: "SectionUnsupported: this role has no " + name + " section"}
		default:
			if f, ok := s.(Fresh); ok {
				a := arrived
				a.Fresh = arrivedGen != 0 && arrivedGen == gen
				f.Arrived(gen, a)
			}
			if p, ok := s.(Proven); ok {
				pr := proof
				if e.cfg.Bundle != nil {
					if pr.Bundle = e.cfg.Bundle(); pr.Bundle != nil {
						pr.Signer = pr.Bundle.Signer(pr.Signature)
					}
				}
				p.HeldProof(pr)
			}
			prev := e.state(name)
			sameGen := prev != nil && prev.Generation == gen
			switch {
			case sameGen && (prev.State == Retrying || prev.State == Progressing) && time.Now().Before(prev.next):
				settled = false
				next = earliest(next, prev.next)
				continue
			case sameGen && prev.State == Failed && !repairing:
				// Terminal for this generation: only a new spec or the
				// repair pass tries it again.
				continue
			default:
				st = e.run(ctx, s, gen, body, prev)
			}
		}
		if ctx.Err() != nil {
			return time.Time{}
		}
		if st.State == Retrying || st.State == Progressing {
			settled = false
			next = earliest(next, st.next)
		}
		if e.setState(st) {
			changed = true
		}
	}
	if settled {
		e.mu.Lock()
		advance := e.observed != gen && e.gen == gen
		e.mu.Unlock()
		if advance {
			if err := e.storeObserved(gen); err != nil {
				e.log.Error("storing the observed generation", "err", err)
			} else {
				e.mu.Lock()
				e.observed = gen
				e.mu.Unlock()
				e.log.Info("observed generation", "generation", gen)
				changed = true
			}
		}
	}
	if changed {
		e.changed()
	}
	return next
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// run plans and, when needed, applies one section.
func (e *Engine) run(ctx context.Context, s Section, gen uint64, body json.RawMessage, prev *SectionState) SectionState {
	st := SectionState{Name: s.Name(), Generation: gen}
	if prev != nil && prev.Generation == gen {
		st.Attempts = prev.Attempts
	}
	fail := func(stage string, err error) SectionState {
		st.Attempts++
		st.Message = stage + ": " + err.Error()
		if IsTerminal(err) {
			st.State = Failed
		} else {
			st.State = Retrying
			st.next = time.Now().Add(max(backoff.Full(st.Attempts-1, e.cfg.RetryBase, e.cfg.RetryMax), 100*time.Millisecond))
		}
		return st
	}
	p, err := s.Plan(ctx, body)
	if err != nil {
		return fail("plan", err)
	}
	if len(p.Changes) == 0 {
		st.State = Converged
		st.Attempts = 0
		return st
	}
	st.Changes = clip(p.Changes)
	if err := s.Apply(ctx, body, p); err != nil {
		return fail("apply", err)
	}
	again, err := s.Plan(ctx, body)
	if err != nil {
		return fail("plan after apply", err)
	}
	if len(again.Changes) == 0 {
		st.State = Converged
		st.Attempts = 0
		st.Changes = nil // what is left to change: nothing
		return st
	}
	// Applied, but the machine is not there yet (work that finishes in
	// the background): check again soon.
	st.State = Progressing
	st.Changes = clip(again.Changes)
	st.next = time.Now().Add(e.cfg.Recheck)
	return st
}

func clip(c []string) []string {
	if len(c) > 20 {
		c = append(append([]string(nil), c[:19]...), fmt.Sprintf("... and %d more", len(c)-19))
	}
	return c
}

func (e *Engine) state(name string) *SectionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st := e.states[name]; st != nil {
		c := *st
		return &c
	}
	return nil
}

// setState records st and reports whether what it says changed.
func (e *Engine) setState(st SectionState) bool {
	e.mu.Lock()
	prev := e.states[st.Name]
	same := prev != nil && prev.State == st.State && prev.Generation == st.Generation && prev.Message == st.Message &&
		prev.Attempts == st.Attempts && slices.Equal(prev.Changes, st.Changes)
	if prev != nil && prev.State == st.State && prev.Generation == st.Generation {
		st.Since = prev.Since
	} else {
		st.Since = e.cfg.Now()
	}
	e.states[st.Name] = &st
	e.mu.Unlock()
	if !same {
		lvl := slog.LevelInfo
		if st.State == Failed || st.State == Retrying {
			lvl = slog.LevelWarn
		}
		e.log.Log(context.Background(), lvl, "section", "section", st.Name, "state", st.State, "generation", st.Generation, "message", st.Message, "attempts", st.Attempts)
		if e.cfg.Event != nil && (prev == nil || prev.State != st.State) && (st.State == Failed || st.State == Converged || st.State == Unsupported) {
			e.cfg.Event("section."+strings.ToLower(st.State), map[string]any{"section": st.Name, "generation": st.Generation, "message": st.Message})
		}
	}
	return !same
}

func (e *Engine) storeObserved(gen uint64) error {
	if e.cfg.DataDir == "" {
		return nil
	}
	b, _ := json.Marshal(map[string]uint64{"observed_generation": gen})
	return atomicfile.Write(filepath.Join(e.cfg.DataDir, ObservedFile), b, 0o600)
}

// Status returns the engine's state, sections in the fixed order.
func (e *Engine) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Status{Applied: e.gen, Observed: e.observed, Sections: []SectionState{},
		SpecError: e.refused.err, RefusedGeneration: e.refused.gen, WantFull: e.refused.wantFull}
	for _, name := range nodespec.Order {
		if s := e.states[name]; s != nil {
			st.Sections = append(st.Sections, *s)
		}
	}
	return st
}

// Proto returns the status's StatusReport fields.
func (s Status) Proto() *bcdv1.StatusReport {
	r := &bcdv1.StatusReport{AppliedGeneration: s.Applied, ObservedGeneration: s.Observed,
		WantFullSpec: s.WantFull, SpecError: s.SpecError, RefusedGeneration: s.RefusedGeneration}
	for _, x := range s.Sections {
		r.SectionStates = append(r.SectionStates, &bcdv1.SectionStatus{Name: x.Name, State: x.State, Generation: x.Generation,
			Message: x.Message, Changes: x.Changes, SinceUnixMs: x.Since.UnixMilli(), Attempts: uint32(x.Attempts)})
	}
	return r
}

// Spec returns the held spec's generation and canonical JSON.
func (e *Engine) Spec() (uint64, []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen, append([]byte(nil), e.raw...)
}
