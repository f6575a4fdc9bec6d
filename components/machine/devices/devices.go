// Package devices is the node's devices section of the NodeSpec: GPU
// holds. Each hold names an allocation and the GPUs it holds (by UUID or
// index) and optional limits; for each admitted hold the node keeps a CDI
// spec (/etc/cdi/bcd-<allocation>.json, kind bcd.dev/gpu, rendered by
// components/helper/cdispec) and an environment file
// (/run/bcd-alloc/<allocation>.env), written as root or, unprivileged,
// through bcd helper, which checks them itself. A released hold's files
// go; a hold that did not change is never written again, so a restart
// leaves its files untouched.
//
// Admission: a GPU this host does not have, a GPU another hold of the
// spec already holds, a GPU with an Xid condition, or limits beyond the
// host fail that hold alone (resources-exhausted or its reason); the
// others converge, and the section ends FAILED naming the failed holds.
// docs/devices.md describes the section.
package devices

import (
	"context"
	"encoding/json"
	"fmt"
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
}

// Hold is one allocation's GPUs.
type Hold struct {
	Allocation string   `json:"allocation"`
	GPUs       []string `json:"gpus"`
	Limits     *Limits  `json:"limits,omitempty"`
}

// Limits bound what a hold's workload may use.
type Limits struct {
	CPUs        string `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
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
	// Inventory reads the machine (its GPUs with their device minors, its
	// CPUs and memory).
	Inventory func(ctx context.Context) (*inventory.Inventory, error)
	// Files is nil when this node may not bind devices (unprivileged
	// without [helper]): every hold then fails as node-unprivileged.
	Files Files
	// Unhealthy reports whether a GPU (UUID) has a condition that forbids
	// new holds (an Xid this boot); nil: none.
	Unhealthy func(uuid string) bool
	// Event records AllocationBound, AllocationReleased, AllocationFailed.
	Event func(typ string, body any)
}

// Section is the devices section.
type Section struct {
	cfg Config

	mu     sync.Mutex
	held   map[string]string // GPU UUID -> allocation, as last applied
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
		if h.Limits != nil && h.Limits.CPUs != "" {
			if _, err := wire.ParseCPUList(h.Limits.CPUs); err != nil {
				return b, fmt.Errorf("holds[%d]: limits.cpus: %w", i, err)
			}
		}
	}
	return b, nil
}

// Check decodes body strictly.
func (s *Section) Check(body json.RawMessage) error { _, err := Decode(body); return err }

// admitted is a hold that passed admission, with its files.
type admitted struct {
	hold Hold
	gpus []cdispec.GPU
	cdi  []byte
	env  []byte
}

// admit decides each hold; failed maps allocation to its reason.
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
	byRef := map[string]inventory.GPU{}
	for i, g := range inv.GPUs {
		byRef[g.UUID] = g
		byRef[strconv.Itoa(i)] = g
	}
	hostCPUs := map[int]bool{}
	for i := range max(inv.CPU.Threads, 0) {
		hostCPUs[i] = true
	}
	taken := map[string]string{} // uuid -> allocation
	var out []admitted
	for _, h := range b.Holds {
		var gpus []cdispec.GPU
		var why string
		for _, ref := range h.GPUs {
			g, ok := byRef[ref]
			switch {
			case !ok:
				why = fmt.Sprintf("GPU %s is not on this host", ref)
			case g.Minor == nil:
				why = fmt.Sprintf("GPU %s has no device minor", ref)
			case taken[g.UUID] != "":
				why = fmt.Sprintf("resources-exhausted: GPU %s is held by %s", g.UUID, taken[g.UUID])
			case s.cfg.Unhealthy != nil && s.cfg.Unhealthy(g.UUID):
				why = fmt.Sprintf("GPU %s is UNHEALTHY (an Xid this boot)", g.UUID)
			case slices.ContainsFunc(gpus, func(x cdispec.GPU) bool { return x.UUID == g.UUID }):
				why = fmt.Sprintf("GPU %s named twice", g.UUID)
			}
			if why != "" {
				break
			}
			gpus = append(gpus, cdispec.GPU{UUID: g.UUID, Node: fmt.Sprintf("/dev/nvidia%d", *g.Minor)})
		}
		if why == "" && h.Limits != nil {
			if h.Limits.CPUs != "" {
				cpus, _ := wire.ParseCPUList(h.Limits.CPUs) // Decode checked it
				for _, c := range cpus {
					if !hostCPUs[c] {
						why = fmt.Sprintf("resources-exhausted: CPU %d is beyond this host's %d", c, inv.CPU.Threads)
						break
					}
				}
			}
			if why == "" && h.Limits.MemoryBytes > inv.Memory.TotalBytes {
				why = fmt.Sprintf("resources-exhausted: memory %d bytes is beyond this host's %d", h.Limits.MemoryBytes, inv.Memory.TotalBytes)
			}
		}
		if why != "" {
			failed[h.Allocation] = why
			continue
		}
		cdi, err := cdispec.Render(h.Allocation, gpus)
		if err != nil {
			failed[h.Allocation] = err.Error()
			continue
		}
		for _, g := range gpus {
			taken[g.UUID] = h.Allocation
		}
		out = append(out, admitted{hold: h, gpus: gpus, cdi: cdi, env: cdispec.RenderEnv(h.Allocation, gpus)})
	}
	return out, failed, nil
}

// plan is what differs: files to write and allocations to release.
type plan struct {
	admitted []admitted
	failed   map[string]string
	write    []admitted
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
	for _, a := range adm {
		want[a.hold.Allocation] = true
		cdi, err1 := s.cfg.Files.Read("cdi", a.hold.Allocation)
		env, err2 := s.cfg.Files.Read("allocation-env", a.hold.Allocation)
		if err1 != nil || err2 != nil || string(cdi) != string(a.cdi) || string(env) != string(a.env) {
			p.write = append(p.write, a)
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
	for _, a := range p.write {
		cp.Changes = append(cp.Changes, "bind "+a.hold.Allocation+" ("+uuids(a.gpus)+")")
	}
	for _, id := range p.release {
		cp.Changes = append(cp.Changes, "release "+id)
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

func uuids(gs []cdispec.GPU) string {
	var u []string
	for _, g := range gs {
		u = append(u, g.UUID)
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

// Apply writes the admitted holds' files, removes released ones, and
// fails (terminally) when any hold could not be admitted.
func (s *Section) Apply(ctx context.Context, body json.RawMessage, cp converge.Plan) error {
	p, ok := cp.Detail.(plan)
	if !ok {
		var err error
		if p, err = s.compute(ctx, body); err != nil {
			return err
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

func (s *Section) remember(adm []admitted) {
	held := map[string]string{}
	for _, a := range adm {
		for _, g := range a.gpus {
			held[g.UUID] = a.hold.Allocation
		}
	}
	s.mu.Lock()
	s.held = held
	s.mu.Unlock()
}

// HeldBy returns the allocation holding GPU uuid ("" when none).
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
