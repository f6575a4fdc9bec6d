// Package devices is the node's devices section of the NodeSpec: GPU
// holds. Each hold names an allocation and what it holds: whole GPUs (by
// index or UUID), MIG instances (by MIG UUID or GPU and GI/CI) or slots
// of a GPU the host shares (time-slicing or MPS), and optional limits.
// For each admitted hold the node keeps a CDI spec
// (/etc/cdi/bcd-<allocation>.json, kind bcd.dev/gpu, rendered by
// components/helper/cdispec), an environment file
// (/run/bcd-alloc/<allocation>.env) and, with CPU or memory limits, a
// systemd slice (bcd-alloc-<allocation>.slice), written as root or,
// unprivileged, through bcd helper, which checks them itself. A released
// hold's files and slice go; a hold that did not change is never written
// again, so a restart leaves its files untouched.
//
// Admission is parent-aware: a whole GPU conflicts with every hold on it,
// a MIG instance or slot with a whole-GPU hold and the same instance or
// slot. Holds already bound are admitted first, so a new hold never
// displaces a running one. A GPU this host does not have, one a VM has,
// one with an Xid condition, or limits beyond the host fail that hold
// alone (resources-exhausted or its reason); the others converge, and
// the section ends FAILED naming the failed holds. docs/devices.md
// describes the section.
package devices

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/machine/inventory"
)

// Body is the devices section.
type Body struct {
	Holds []Hold `json:"holds"`
	// Sharing is the host's GPU sharing mode, which decides how many slot
	// holds a GPU takes; without it a GPU has no slots.
	Sharing *Sharing `json:"sharing,omitempty"`
}

// Sharing is how the host shares a GPU between slot holds: time-slicing
// or MPS, in Slots shares per GPU.
type Sharing struct {
	Mode  string `json:"mode"`
	Slots int    `json:"slots"`
}

// Hold is one allocation's devices: each entry of GPUs is a whole GPU (its
// index or GPU-UUID), a MIG instance (its MIG-UUID, or <gpu>/gi<G>/ci<C>)
// or a slot of a shared GPU (<gpu>/slot<S>).
type Hold struct {
	Allocation string   `json:"allocation"`
	GPUs       []string `json:"gpus"`
	Limits     *Limits  `json:"limits,omitempty"`
}

// Limits bound what a hold's workload may use: CPUs and memory in its
// cgroup slice, huge pages against what the host has.
type Limits struct {
	CPUs        string `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	HugePages2M int64  `json:"hugepages_2m,omitempty"`
}

// Files is where hold files go: kind "cdi" or "allocation-env", by
// allocation id (the helper's file table names the paths).
type Files interface {
	Read(kind, id string) ([]byte, error)
	List(kind string) ([]string, error)
	Write(ctx context.Context, kind, id string, data []byte) error
	Remove(ctx context.Context, kind, id string) error
}

// Config wires the section.
type Config struct {
	// Inventory reads the machine (its GPUs with their device minors and
	// MIG instances, its CPUs and memory).
	Inventory func(ctx context.Context) (*inventory.Inventory, error)
	// MIGCaps reads the nvidia-caps table (cdispec.MIGMinorsFile); nil:
	// none, so no MIG instance can be held.
	MIGCaps func() (cdispec.MIGCaps, error)
	// Files is nil when this node may not bind devices (unprivileged
	// without [helper]): every hold then fails as node-unprivileged.
	Files Files
	// Slices confines holds with CPU or memory limits to their cgroup
	// slice; nil: such holds fail (no systemd to run them).
	Slices Slices
	// Unhealthy reports whether a GPU (UUID) has a condition that forbids
	// new holds (a failing check or an Xid this boot), and why; nil: none.
	Unhealthy func(uuid string) (bool, string)
	// InVM names the instance a GPU (UUID) is passed through to; nil or
	// "": none. No hold sits beside a GPU a VM has.
	InVM func(uuid string) string
	// Event records AllocationBound, AllocationReleased, AllocationFailed.
	Event func(typ string, body any)
}

// Section is the devices section.
type Section struct {
	cfg Config

	mu     sync.Mutex
	held   map[string]string // GPU UUID -> what holds it, as last applied
	failed map[string]string // allocation -> the reason it failed, last reported
}

// New makes the section.
func New(cfg Config) *Section {
	return &Section{cfg: cfg, held: map[string]string{}, failed: map[string]string{}}
}

// Name is "devices".
func (s *Section) Name() string { return "devices" }

// Decode reads the section strictly.
func Decode(body json.RawMessage) (Body, error) {
	var b Body
	if err := converge.DecodeSection(body, &b); err != nil {
		return b, err
	}
	if sh := b.Sharing; sh != nil {
		if sh.Mode != "time-slicing" && sh.Mode != "mps" {
			return b, fmt.Errorf("sharing.mode %q is not time-slicing or mps", sh.Mode)
		}
		if sh.Slots < 2 || sh.Slots > 64 {
			return b, fmt.Errorf("sharing.slots %d: 2 to 64 per GPU", sh.Slots)
		}
	}
	seen := map[string]bool{}
	for i, h := range b.Holds {
		switch {
		case !cdispec.ValidAllocation(h.Allocation):
			return b, fmt.Errorf("holds[%d]: allocation %q is not [A-Za-z0-9_-], 1 to 128", i, h.Allocation)
		case seen[h.Allocation]:
			return b, fmt.Errorf("holds[%d]: allocation %s named twice", i, h.Allocation)
		case len(h.GPUs) == 0 || len(h.GPUs) > 64:
			return b, fmt.Errorf("holds[%d]: 1 to 64 GPUs", i)
		}
		seen[h.Allocation] = true
		for _, r := range h.GPUs {
			if _, err := ParseRef(r); err != nil {
				return b, fmt.Errorf("holds[%d]: %w", i, err)
			}
		}
		if l := h.Limits; l != nil {
			if l.CPUs != "" {
				if _, err := wire.ParseCPUList(l.CPUs); err != nil {
					return b, fmt.Errorf("holds[%d]: limits.cpus: %w", i, err)
				}
			}
			if l.MemoryBytes != 0 && l.MemoryBytes < wire.MinMemoryMax {
				return b, fmt.Errorf("holds[%d]: limits.memory_bytes %d is below %d (16 MiB)", i, l.MemoryBytes, wire.MinMemoryMax)
			}
			if l.HugePages2M < 0 {
				return b, fmt.Errorf("holds[%d]: limits.hugepages_2m is negative", i)
			}
		}
	}
	return b, nil
}

// Check decodes body strictly.
func (s *Section) Check(body json.RawMessage) error { _, err := Decode(body); return err }

// admitted is a hold that passed admission, with its files.
type admitted struct {
	hold  Hold
	gpus  []cdispec.GPU
	units []unit
	cdi   []byte
	env   []byte
}

// sliced reports whether the hold runs in a slice of its own: it limits
// CPUs or memory.
func (a admitted) sliced() bool {
	l := a.hold.Limits
	return l != nil && (l.CPUs != "" || l.MemoryBytes != 0)
}

// claims is what admitted holds have taken, per GPU UUID.
type claims struct {
	whole map[string]string            // GPU -> allocation
	mig   map[string]map[string]string // GPU -> "gi/ci" -> allocation
	slot  map[string]map[int]string    // GPU -> slot -> allocation
}

// conflict names the allocation that already holds what u needs, "" when
// none: a whole GPU conflicts with every hold on it, a MIG instance or a
// slot with a whole-GPU hold and with the same instance or slot.
func (c claims) conflict(u unit) string {
	g := u.gpu.UUID
	if a := c.whole[g]; a != "" {
		return a
	}
	switch u.kind {
	case kindWhole:
		if keys := slices.Sorted(maps.Keys(c.mig[g])); len(keys) > 0 {
			return c.mig[g][keys[0]]
		}
		if keys := slices.Sorted(maps.Keys(c.slot[g])); len(keys) > 0 {
			return c.slot[g][keys[0]]
		}
	case kindMIG:
		return c.mig[g][u.migKey()]
	case kindSlot:
		return c.slot[g][u.slot]
	}
	return ""
}

func (c claims) take(u unit, alloc string) {
	g := u.gpu.UUID
	switch u.kind {
	case kindWhole:
		c.whole[g] = alloc
	case kindMIG:
		if c.mig[g] == nil {
			c.mig[g] = map[string]string{}
		}
		c.mig[g][u.migKey()] = alloc
	case kindSlot:
		if c.slot[g] == nil {
			c.slot[g] = map[int]string{}
		}
		c.slot[g][u.slot] = alloc
	}
}

// admit decides each hold; failed maps allocation to its reason. Holds
// already bound (their CDI spec is on disk) are admitted first, so a hold
// added to the spec never displaces one that runs; the rest follow in the
// spec's order.
func (s *Section) admit(ctx context.Context, b Body) ([]admitted, map[string]string, error) {
	failed := map[string]string{}
	if len(b.Holds) == 0 {
		return nil, failed, nil
	}
	if s.cfg.Files == nil {
		for _, h := range b.Holds {
			failed[h.Allocation] = "node-unprivileged: bcd node runs unprivileged without [helper], so it may bind no device"
		}
		return nil, failed, nil
	}
	inv, err := s.cfg.Inventory(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the machine: %w", err)
	}
	caps := cdispec.MIGCaps{}
	if s.cfg.MIGCaps != nil && hasMIG(inv) {
		if caps, err = s.cfg.MIGCaps(); err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", cdispec.MIGMinorsFile, err)
		}
	}
	bound, err := s.cfg.Files.List("cdi")
	if err != nil {
		return nil, nil, fmt.Errorf("listing CDI specs: %w", err)
	}
	m := newMachine(inv, caps, b.Sharing)
	taken := claims{whole: map[string]string{}, mig: map[string]map[string]string{}, slot: map[string]map[int]string{}}
	// Two passes, bound holds first; results kept at their spec position.
	byPos := make([]*admitted, len(b.Holds))
	for _, boundPass := range []bool{true, false} {
		for i, h := range b.Holds {
			if slices.Contains(bound, h.Allocation) != boundPass {
				continue
			}
			a, why := s.admitOne(h, m, taken)
			if why != "" {
				failed[h.Allocation] = why
				continue
			}
			for _, u := range a.units {
				taken.take(u, h.Allocation)
			}
			byPos[i] = &a
		}
	}
	var out []admitted
	for _, a := range byPos {
		if a != nil {
			out = append(out, *a)
		}
	}
	return out, failed, nil
}

// unhealthy is why GPU g takes no new hold, "" when it does.
func unhealthy(f func(string) (bool, string), g string) string {
	bad, why := f(g)
	switch {
	case !bad:
		return ""
	case why == "":
		return "a failing health condition"
	}
	return why
}

// admitOne resolves and checks one hold against what is taken; a non-empty
// reason fails it.
func (s *Section) admitOne(h Hold, m *machine, taken claims) (admitted, string) {
	a := admitted{hold: h}
	for _, r := range h.GPUs {
		u, why := m.resolve(r)
		if why != "" {
			return a, why
		}
		g := u.gpu.UUID
		var sick, vm string
		if s.cfg.Unhealthy != nil {
			sick = unhealthy(s.cfg.Unhealthy, g)
		}
		if s.cfg.InVM != nil {
			vm = s.cfg.InVM(g)
		}
		switch {
		case sick != "":
			return a, fmt.Sprintf("GPU %s is UNHEALTHY (%s)", g, sick)
		case vm != "":
			return a, fmt.Sprintf("resources-exhausted: GPU %s is passed through to instance %s", g, vm)
		case slices.ContainsFunc(a.units, func(x unit) bool { return x.overlaps(u) }):
			return a, fmt.Sprintf("%s is named twice (or inside another entry of the same hold)", r)
		}
		if by := taken.conflict(u); by != "" {
			return a, fmt.Sprintf("resources-exhausted: %s is held by %s", u, by)
		}
		a.units = append(a.units, u)
		a.gpus = append(a.gpus, u.devices...)
	}
	if why := m.fits(h.Limits); why != "" {
		return a, why
	}
	if a.sliced() {
		if _, err := wire.SliceID(wire.SliceName(h.Allocation)); err != nil {
			return a, fmt.Sprintf("limits need a cgroup slice, and %v", err)
		}
		if s.cfg.Slices == nil {
			return a, "limits need a cgroup slice, and this node has no systemd to run one"
		}
	}
	var extra []string
	if sh := m.sharing; sh != nil && sh.Mode == "mps" {
		if n := maxSlotsOnOneGPU(a.units); n > 0 {
			extra = append(extra, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="+strconv.Itoa(100*n/sh.Slots))
		}
	}
	cdi, err := cdispec.Render(h.Allocation, a.gpus, extra...)
	if err != nil {
		return a, err.Error()
	}
	a.cdi, a.env = cdi, cdispec.RenderEnv(h.Allocation, a.gpus, extra...)
	return a, ""
}

// plan is what differs: holds to bind (files to write), slices to apply
// and remove, allocations to release.
type plan struct {
	admitted []admitted
	failed   map[string]string
	write    []admitted
	slice    []admitted
	unslice  []string
	release  []string
}

func (s *Section) compute(ctx context.Context, body json.RawMessage) (plan, error) {
	b, err := Decode(body)
	if err != nil {
		return plan{}, converge.Terminal(err)
	}
	adm, failed, err := s.admit(ctx, b)
	if err != nil {
		return plan{}, err
	}
	p := plan{admitted: adm, failed: failed}
	if s.cfg.Files == nil {
		return p, nil
	}
	want := map[string]bool{}
	wantSlice := map[string]bool{}
	for _, a := range adm {
		want[a.hold.Allocation] = true
		cdi, err1 := s.cfg.Files.Read("cdi", a.hold.Allocation)
		env, err2 := s.cfg.Files.Read("allocation-env", a.hold.Allocation)
		if err1 != nil || err2 != nil || string(cdi) != string(a.cdi) || string(env) != string(a.env) {
			p.write = append(p.write, a)
		}
		if a.sliced() {
			wantSlice[a.hold.Allocation] = true
			cur, err := s.cfg.Slices.Current(a.hold.Allocation)
			if err != nil {
				return plan{}, fmt.Errorf("reading the slice of %s: %w", a.hold.Allocation, err)
			}
			if string(cur) != string(wire.SliceDropin(a.hold.Limits.CPUs, "", a.hold.Limits.MemoryBytes)) {
				p.slice = append(p.slice, a)
			}
		}
	}
	have := map[string]bool{}
	for _, kind := range []string{"cdi", "allocation-env"} {
		ids, err := s.cfg.Files.List(kind)
		if err != nil {
			return plan{}, fmt.Errorf("listing %s files: %w", kind, err)
		}
		for _, id := range ids {
			have[id] = true
		}
	}
	for id := range have {
		if !want[id] {
			p.release = append(p.release, id)
		}
	}
	sort.Strings(p.release)
	if s.cfg.Slices != nil {
		ids, err := s.cfg.Slices.List()
		if err != nil {
			return plan{}, fmt.Errorf("listing allocation slices: %w", err)
		}
		for _, id := range ids {
			if !wantSlice[id] {
				p.unslice = append(p.unslice, id)
			}
		}
		sort.Strings(p.unslice)
	}
	return p, nil
}

// Plan lists the holds to bind and release, and the failed holds.
func (s *Section) Plan(ctx context.Context, body json.RawMessage) (converge.Plan, error) {
	p, err := s.compute(ctx, body)
	if err != nil {
		return converge.Plan{}, err
	}
	s.remember(p.admitted)
	var cp converge.Plan
	for _, a := range p.slice {
		cp.Changes = append(cp.Changes, "slice "+a.hold.Allocation+" ("+limitsText(a.hold.Limits)+")")
	}
	for _, a := range p.write {
		cp.Changes = append(cp.Changes, "bind "+a.hold.Allocation+" ("+uuids(a.gpus)+")")
	}
	for _, id := range p.release {
		cp.Changes = append(cp.Changes, "release "+id)
	}
	for _, id := range p.unslice {
		cp.Changes = append(cp.Changes, "remove the slice of "+id)
	}
	if len(cp.Changes) == 0 && len(p.failed) > 0 {
		// Nothing to write, but holds failed: Apply reports them.
		for _, id := range sortedKeys(p.failed) {
			cp.Changes = append(cp.Changes, "fail "+id+": "+p.failed[id])
		}
	}
	cp.Detail = p
	return cp, nil
}

func limitsText(l *Limits) string {
	var parts []string
	if l.CPUs != "" {
		parts = append(parts, "cpus "+l.CPUs)
	}
	if l.MemoryBytes != 0 {
		parts = append(parts, "memory "+strconv.FormatUint(l.MemoryBytes, 10))
	}
	return strings.Join(parts, ", ")
}

func uuids(gs []cdispec.GPU) string {
	var u []string
	for _, g := range gs {
		if !slices.Contains(u, g.UUID) {
			u = append(u, g.UUID)
		}
	}
	return strings.Join(u, ",")
}

func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}

// Apply confines the slices of holds with limits first (so a workload
// started on a new hold is confined from its start), writes the admitted
// holds' files, removes released ones and their slices, and fails
// (terminally) when any hold could not be admitted.
func (s *Section) Apply(ctx context.Context, body json.RawMessage, cp converge.Plan) error {
	p, ok := cp.Detail.(plan)
	if !ok {
		var err error
		if p, err = s.compute(ctx, body); err != nil {
			return err
		}
	}
	for _, a := range p.slice {
		if err := s.cfg.Slices.Apply(ctx, a.hold.Allocation, a.hold.Limits.CPUs, a.hold.Limits.MemoryBytes); err != nil {
			return fmt.Errorf("binding %s: slice %s: %w", a.hold.Allocation, wire.SliceName(a.hold.Allocation), err)
		}
	}
	for _, a := range p.write {
		if err := s.cfg.Files.Write(ctx, "cdi", a.hold.Allocation, a.cdi); err != nil {
			return fmt.Errorf("binding %s: CDI spec: %w", a.hold.Allocation, err)
		}
		if err := s.cfg.Files.Write(ctx, "allocation-env", a.hold.Allocation, a.env); err != nil {
			return fmt.Errorf("binding %s: environment: %w", a.hold.Allocation, err)
		}
		s.event("AllocationBound", map[string]any{"allocation": a.hold.Allocation, "gpus": uuids(a.gpus)})
	}
	for _, id := range p.release {
		for _, kind := range []string{"cdi", "allocation-env"} {
			if err := s.cfg.Files.Remove(ctx, kind, id); err != nil {
				return fmt.Errorf("releasing %s: %w", id, err)
			}
		}
		s.event("AllocationReleased", map[string]any{"allocation": id})
	}
	for _, id := range p.unslice {
		if err := s.cfg.Slices.Remove(ctx, id); err != nil {
			return fmt.Errorf("releasing %s: slice %s: %w", id, wire.SliceName(id), err)
		}
	}
	s.remember(p.admitted)
	s.mu.Lock()
	var newly []string
	for id, why := range p.failed {
		if s.failed[id] != why {
			newly = append(newly, id)
		}
	}
	s.failed = p.failed
	s.mu.Unlock()
	sort.Strings(newly)
	for _, id := range newly {
		s.event("AllocationFailed", map[string]any{"allocation": id, "reason": p.failed[id]})
	}
	if len(p.failed) > 0 {
		var parts []string
		for _, id := range sortedKeys(p.failed) {
			parts = append(parts, id+": "+p.failed[id])
		}
		return converge.Terminal(fmt.Errorf("%d of %d holds failed: %s", len(p.failed), len(p.failed)+len(p.admitted), strings.Join(parts, "; ")))
	}
	return nil
}

func (s *Section) event(typ string, body any) {
	if s.cfg.Event != nil {
		s.cfg.Event(typ, body)
	}
}

// remember records, per GPU, what holds it: "a1" for a whole GPU,
// "a2 (MIG gi2/ci0), a3 (MIG gi3/ci0)" or "a4 (slot 1)" for parts of it.
func (s *Section) remember(adm []admitted) {
	parts := map[string][]string{}
	for _, a := range adm {
		for _, u := range a.units {
			what := a.hold.Allocation
			if sh := u.short(); sh != "" {
				what += " (" + sh + ")"
			}
			parts[u.gpu.UUID] = append(parts[u.gpu.UUID], what)
		}
	}
	held := map[string]string{}
	for g, p := range parts {
		held[g] = strings.Join(p, ", ")
	}
	s.mu.Lock()
	s.held = held
	s.mu.Unlock()
}

// HeldBy returns what holds GPU uuid, or any part of it ("" when
// nothing): gpu.reset refuses a GPU any hold touches.
func (s *Section) HeldBy(uuid string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[uuid]
}

// SetEvent is given the agent's event log (converge.Evented).
func (s *Section) SetEvent(f func(typ string, body any)) {
	if s.cfg.Event == nil {
		s.cfg.Event = f
	}
}
