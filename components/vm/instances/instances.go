// Package instances is the node's instances section of the NodeSpec, the
// converger: it makes the host run exactly the section's instances on a
// vmruntime.Runtime. For each instance it fetches the base image
// (components/vm/images), creates the instance's qcow2 disk over it once
// and checks its header (components/vm/qcow2), writes the NoCloud seed
// once (components/vm/seed), ensures the domain and sets its state. An
// owned domain the section no longer names is destroyed and its directory
// removed; an image no instance names is removed. A domain bcd did not
// create is never touched: an instance named like one fails. An instance
// that fails, fails alone (InstanceFailed, once per reason); the others
// converge. docs/instances.md describes the section.
package instances

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/snapshot"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Files of an instance, in data_dir/instances/<id>/.
const (
	DiskFile = vmruntime.DiskFile
	SeedFile = vmruntime.SeedFile
)

// Config wires the section.
type Config struct {
	// Dir is data_dir/instances: one directory per instance.
	Dir string
	// Runtime runs the domains; nil: this host runs none, and a section
	// naming any instance fails.
	Runtime vmruntime.Runtime
	// Images holds the base images.
	Images *images.Store
	// Disk creates an instance disk at path: a qcow2 over base in
	// baseFormat (base.Path "" for an empty disk) of size bytes (0: the
	// base's). nil: QEMUImg.
	Disk func(ctx context.Context, path string, base images.Base, baseFormat string, size int64) error
	// UserData fetches an instance's user data; nil: an instance asking
	// for user data fails.
	UserData func(ctx context.Context, in spec.Instance) ([]byte, error)
	// Event records InstanceFailed.
	Event func(typ string, body any)
	// GPUs lists this host's GPUs (UUIDs) from its inventory; nil: none,
	// so an instance with a GPU fails.
	GPUs func(ctx context.Context) ([]string, error)
	// HeldBy names the allocation whose hold (the devices section) has a
	// GPU, "" when none: such a GPU is not passed through. nil: none.
	HeldBy func(uuid string) string
	// Network loads the instances' network policy from the section and
	// the held spec's proof (netguard.Guard.Apply, through bcd helper)
	// before any domain is ensured, when an instance has a NIC. It
	// answers the instances whose policy could not be expressed: they
	// fail alone. Its error fails every instance with a NIC, and so does
	// a nil Network: none runs unguarded.
	Network func(ctx context.Context, body []byte, proof rootsig.Proof) (failed map[string]string, err error)
	// Snapshots keeps the snapshots instances restore from
	// (data_dir/snapshots): each archive fetched as a raw image, then
	// unpacked beside it into <sha256>.d; nil: restore_from fails.
	Snapshots *images.Store
	// Busy reports an instance a snapshot (instance.snapshot) holds: a
	// pass leaves it as it is meanwhile (the section PROGRESSING), so the
	// converger never starts a domain the snapshot saved before its disk
	// is copied. nil: none is.
	Busy func(id string) bool
}

// Section is the instances section.
type Section struct {
	cfg Config

	mu        sync.Mutex
	failed    map[string]string       // instance -> the reason it failed, last reported
	fetches   map[string]*fetchResult // digest -> its background fetch
	publish   func([]byte)            // the role report's setter
	published []byte                  // what was last published
	inVM      map[string]string       // GPU UUID (lower case) -> the owned domain it is passed to
	proof     *rootsig.Proof          // the held spec's (converge.Proven)
	secret    func(ctx context.Context, name, workflowID string) ([]byte, error)
	body      json.RawMessage // the section of the pass under way
}

// SecretUserData prefixes the secret that is an instance's user data:
// instance-user-data/<allocation>, asked for with the workflow
// "instances" (the gateway answers it only for an allocation the node's
// section gives user data).
const SecretUserData = "instance-user-data/"

// SetSecret is given the agent's sealed secret fetch: without
// Config.UserData, an instance's user data is the secret
// instance-user-data/<allocation>.
func (s *Section) SetSecret(f func(ctx context.Context, name, workflowID string) ([]byte, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secret = f
}

// userData fetches in's user data: Config.UserData, else the secret.
func (s *Section) userData(ctx context.Context, in spec.Instance) ([]byte, error) {
	if s.cfg.UserData != nil {
		return s.cfg.UserData(ctx, in)
	}
	s.mu.Lock()
	f := s.secret
	s.mu.Unlock()
	if f == nil {
		return nil, errNoUserData
	}
	return f(ctx, SecretUserData+in.Allocation, "instances")
}

var errNoUserData = errors.New("user data is not fetched on this node")

// HeldProof keeps the proof of the held spec (converge.Proven): a
// runtime through bcd helper defines a domain only with it.
func (s *Section) HeldProof(p rootsig.Proof) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proof = &p
}

// Signed returns the section of the pass under way and the held spec's
// proof, for a runtime whose definitions bcd helper takes only from the
// signed section (libvirtrt's Config.Signed); m is what the converger
// asks for, which the helper reads from the section itself.
func (s *Section) Signed(vmruntime.Machine) ([]byte, rootsig.Proof, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proof == nil {
		return nil, rootsig.Proof{}, errors.New("no proof of the held spec yet")
	}
	return s.body, *s.proof, nil
}

// Report is the node's role report section "instances": every domain the
// runtime lists, bcd's and others', and why instances failed. Complete is
// false when the runtime could not list its domains.
type Report struct {
	Complete bool              `json:"complete"`
	Domains  []ReportDomain    `json:"domains"`
	Failed   map[string]string `json:"failed,omitempty"`
}

// ReportDomain is one domain of the report.
type ReportDomain struct {
	ID    string `json:"id"`
	State string `json:"state"`
	// Owned: bcd created it; a domain it did not create is only reported.
	Owned bool `json:"owned"`
}

// Status is what bcd status shows: every domain the runtime listed at
// the last pass and every instance that failed (one without a domain
// too), and whether the runtime listed them all; before the first pass,
// nothing, complete.
func (s *Section) Status() ([]status.Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r map[string]Report
	if len(s.published) == 0 || json.Unmarshal(s.published, &r) != nil {
		return nil, true
	}
	rep := r["instances"]
	var out []status.Instance
	seen := map[string]bool{}
	for _, d := range rep.Domains {
		out = append(out, status.Instance{ID: d.ID, State: d.State, Owned: d.Owned, Failed: rep.Failed[d.ID]})
		seen[d.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(rep.Failed)) {
		if !seen[id] {
			out = append(out, status.Instance{ID: id, Failed: rep.Failed[id]})
		}
	}
	return out, rep.Complete
}

// SetPublish is given the setter of the role's report sections: the
// section publishes {"instances": Report} when it changes.
func (s *Section) SetPublish(f func([]byte)) {
	s.mu.Lock()
	s.publish = f
	s.mu.Unlock()
}

// publishReport lists the runtime's domains now, for InVM, and publishes
// them when they changed.
func (s *Section) publishReport(ctx context.Context) {
	s.mu.Lock()
	pub := s.publish
	s.mu.Unlock()
	r := Report{Complete: true, Domains: []ReportDomain{}}
	if s.cfg.Runtime != nil {
		l, err := s.cfg.Runtime.List(ctx)
		r.Complete = err == nil
		for _, d := range l {
			r.Domains = append(r.Domains, ReportDomain{ID: d.ID, State: d.State, Owned: d.Owned})
		}
		if err == nil {
			s.observe(l)
		}
	}
	if pub == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failed) > 0 {
		r.Failed = maps.Clone(s.failed)
	}
	b, err := json.Marshal(map[string]Report{"instances": r})
	if err != nil || bytes.Equal(b, s.published) {
		return
	}
	s.published = b
	pub(b)
}

// fetchResult is a background fetch: running until done.
type fetchResult struct {
	done bool
	err  error
}

// New makes the section.
func New(cfg Config) *Section {
	if cfg.Disk == nil {
		cfg.Disk = QEMUImg
	}
	return &Section{cfg: cfg, failed: map[string]string{}, fetches: map[string]*fetchResult{}}
}

// Name is "instances".
func (s *Section) Name() string { return "instances" }

// Check decodes body strictly.
func (s *Section) Check(body json.RawMessage) error { _, err := spec.Decode(body); return err }

// SetEvent is given the agent's event log (converge.Evented).
func (s *Section) SetEvent(f func(typ string, body any)) {
	if s.cfg.Event == nil {
		s.cfg.Event = f
	}
}

// state is what the host has, read once per plan.
type state struct {
	body    spec.Body
	images  map[string]spec.Image
	domains map[string]vmruntime.Domain
	dirs    []string
}

func (s *Section) read(ctx context.Context, body json.RawMessage) (state, error) {
	b, err := spec.Decode(body)
	if err != nil {
		return state{}, converge.Terminal(err)
	}
	st := state{body: b, images: map[string]spec.Image{}, domains: map[string]vmruntime.Domain{}}
	for _, im := range b.Images {
		st.images[im.SHA256] = im
	}
	if s.cfg.Runtime == nil {
		if len(b.Instances) > 0 {
			return st, converge.Terminal(errors.New("this host runs no instance runtime"))
		}
	} else {
		l, err := s.cfg.Runtime.List(ctx)
		if err != nil {
			return st, fmt.Errorf("list domains: %w", err)
		}
		for _, d := range l {
			st.domains[d.ID] = d
		}
		s.observe(l)
	}
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("read %s: %w", s.cfg.Dir, err)
	}
	for _, e := range entries {
		if e.IsDir() && domainxml.ValidID(e.Name()) {
			st.dirs = append(st.dirs, e.Name())
		}
	}
	return st, nil
}

// observe records which GPUs the owned domains of a listing have.
func (s *Section) observe(l []vmruntime.Domain) {
	inVM := map[string]string{}
	for _, d := range l {
		for _, g := range d.Machine.GPUs {
			if d.Owned {
				inVM[strings.ToLower(g)] = d.ID
			}
		}
	}
	s.mu.Lock()
	s.inVM = inVM
	s.mu.Unlock()
}

// InVM names the instance a GPU (UUID) is passed through to, as the
// runtime listed its domains at this section's last plan or apply (or
// now, before the first); "" when none. The devices section, which
// converges first, puts no hold beside it.
func (s *Section) InVM(uuid string) string {
	s.mu.Lock()
	loaded := s.inVM != nil
	s.mu.Unlock()
	if !loaded && s.cfg.Runtime != nil {
		if l, err := s.cfg.Runtime.List(context.Background()); err == nil {
			s.observe(l)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inVM[strings.ToLower(uuid)]
}

// gpus refuses a GPU this host does not have or a hold has.
func (s *Section) gpus(ctx context.Context, in spec.Instance) *failure {
	if len(in.GPUs) == 0 {
		return nil
	}
	if s.cfg.GPUs == nil {
		return fail(true, "this host has no GPU to pass through")
	}
	host, err := s.cfg.GPUs(ctx)
	if err != nil {
		return fail(false, "read the host's GPUs: %v", err)
	}
	for _, g := range in.GPUs {
		if !slices.ContainsFunc(host, func(h string) bool { return strings.EqualFold(h, g) }) {
			return fail(true, "GPU %s is not on this host", g)
		}
		if s.cfg.HeldBy != nil {
			if a := s.cfg.HeldBy(g); a != "" {
				return fail(true, "resources-exhausted: GPU %s is held by %s", g, a)
			}
		}
	}
	return nil
}

// desired reports whether id is an instance of the section.
func (st state) desired(id string) bool {
	return slices.ContainsFunc(st.body.Instances, func(in spec.Instance) bool { return in.ID == id })
}

// keep is the digests of the base images the section's instances name.
func (st state) keep() []string {
	var k []string
	for _, in := range st.body.Instances {
		k = append(k, in.Image)
	}
	return k
}

// keepSnapshots is the digests of the snapshots the section's instances
// restore from: every other is deleted.
func (st state) keepSnapshots() []string {
	var k []string
	for _, in := range st.body.Instances {
		if in.RestoreFrom != nil {
			k = append(k, in.RestoreFrom.SHA256)
		}
	}
	return k
}

// image is what an instance's disk stands on: its base image, or for a
// restore its snapshot's disk (a qcow2 named by the snapshot's digest).
func (st state) image(in spec.Instance) spec.Image {
	if r := in.RestoreFrom; r != nil {
		return spec.Image{SHA256: r.SHA256, Format: spec.QCOW2}
	}
	return st.images[in.Image]
}

// Plan lists what differs: instances to set up or change, domains and
// directories to remove, images no instance names.
func (s *Section) Plan(ctx context.Context, body json.RawMessage) (converge.Plan, error) {
	st, err := s.read(ctx, body)
	if err != nil {
		return converge.Plan{}, err
	}
	var changes []string
	for _, in := range st.body.Instances {
		changes = append(changes, s.planInstance(in, st)...)
	}
	for _, id := range s.removals(st) {
		changes = append(changes, "remove instance "+id)
	}
	unneeded, err := s.cfg.Images.Unneeded(st.keep())
	if err != nil {
		return converge.Plan{}, err
	}
	for _, n := range unneeded {
		changes = append(changes, "remove image "+n)
	}
	if s.cfg.Snapshots != nil {
		unneeded, err := s.cfg.Snapshots.Unneeded(st.keepSnapshots())
		if err != nil {
			return converge.Plan{}, err
		}
		for _, n := range unneeded {
			changes = append(changes, "remove snapshot "+n)
		}
	}
	s.publishReport(ctx)
	return converge.Plan{Changes: changes, Detail: st}, nil
}

func (s *Section) planInstance(in spec.Instance, st state) []string {
	d, defined := st.domains[in.ID]
	if defined && !d.Owned {
		return []string{in.ID + ": a domain bcd did not create has its name"}
	}
	var c []string
	if r := in.RestoreFrom; r != nil {
		if _, err := os.Lstat(s.snapshotDir(r.SHA256)); err != nil {
			if s.refused(r.SHA256) {
				c = append(c, in.ID+": snapshot "+r.SHA256+" refused")
			} else {
				c = append(c, in.ID+": fetch snapshot "+r.SHA256)
			}
		}
	} else if _, err := s.cfg.Images.Ready(st.images[in.Image]); err != nil {
		if s.refused(in.Image) {
			c = append(c, in.ID+": image "+in.Image+" refused")
		} else {
			c = append(c, in.ID+": fetch image "+in.Image)
		}
	}
	for _, f := range []string{DiskFile, SeedFile} {
		if _, err := os.Lstat(filepath.Join(s.cfg.Dir, in.ID, f)); err != nil {
			c = append(c, in.ID+": create "+f)
		} else if f == DiskFile {
			// A disk changed under a defined domain is found here too,
			// not only when something else makes a pass apply.
			if _, err := qcow2.CheckFile(filepath.Join(s.cfg.Dir, in.ID, f), s.backing(st.image(in))); err != nil {
				c = append(c, in.ID+": disk refused")
			}
		}
	}
	switch {
	case !defined:
		c = append(c, in.ID+": define")
	case !d.Machine.Equal(machine(in, st.image(in))):
		c = append(c, in.ID+": redefine")
	}
	if cur := d.State; !defined && in.State != vmruntime.Stopped || defined && cur != in.State {
		c = append(c, in.ID+": "+orStopped(cur)+" -> "+in.State)
	}
	return c
}

func orStopped(s string) string {
	if s == "" {
		return vmruntime.Stopped
	}
	return s
}

// removals are the owned domains and the directories the section no
// longer names.
func (s *Section) removals(st state) []string {
	var out []string
	for id, d := range st.domains {
		if d.Owned && !st.desired(id) {
			out = append(out, id)
		}
	}
	for _, id := range st.dirs {
		if _, has := st.domains[id]; !has && !st.desired(id) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// machine is the domain of an instance: its disk (after an iso base
// image's cdrom, when it boots from one) and its seed.
func machine(in spec.Instance, im spec.Image) vmruntime.Machine {
	m := vmruntime.InstanceMachine(in.ID, in.VCPUs, in.MemoryMiB, im.SHA256, im.Format, in.GPUs)
	m.Taps = vmruntime.InstanceTaps(in.ID, in.NICs)
	return m
}

// failure is why an instance did not converge; terminal when trying
// again in this generation will not mend it.
type failure struct {
	reason   string
	terminal bool
	// pending: waiting for a background fetch, not failed.
	pending bool
}

// Apply removes what the section no longer names, then sets up each
// instance on its own.
func (s *Section) Apply(ctx context.Context, body json.RawMessage, p converge.Plan) error {
	s.mu.Lock()
	s.body = body
	s.mu.Unlock()
	st, ok := p.Detail.(state)
	if !ok {
		var err error
		if st, err = s.read(ctx, body); err != nil {
			return err
		}
	}
	for _, id := range s.removals(st) {
		if s.busy(id) {
			continue
		}
		if d, ok := st.domains[id]; ok && d.Owned {
			if err := s.cfg.Runtime.Destroy(ctx, id); err != nil {
				return fmt.Errorf("remove instance %s: %w", id, err)
			}
		}
		if err := os.RemoveAll(filepath.Join(s.cfg.Dir, id)); err != nil {
			return fmt.Errorf("remove instance %s: %w", id, err)
		}
	}
	named := map[string]bool{}
	for d := range st.images {
		named[d] = true
	}
	for _, d := range st.keepSnapshots() {
		named[d] = true
	}
	s.forgetFetches(named)
	failed := map[string]failure{}
	var pending []string
	guard := s.network(ctx, body, st.body.Instances)
	for _, in := range st.body.Instances {
		if s.busy(in.ID) {
			pending = append(pending, in.ID)
			continue
		}
		if f := guard(in); f != nil {
			failed[in.ID] = *f
			continue
		}
		switch f := s.ensure(ctx, in, st); {
		case f == nil:
		case f.pending:
			pending = append(pending, in.ID)
		default:
			failed[in.ID] = *f
		}
	}
	if _, err := s.cfg.Images.Keep(st.keep()); err != nil {
		return err
	}
	if s.cfg.Snapshots != nil {
		if _, err := s.cfg.Snapshots.Keep(st.keepSnapshots()); err != nil {
			return err
		}
	}
	err := s.report(failed, pending, len(st.body.Instances))
	s.publishReport(ctx)
	return err
}

// report raises InstanceFailed for each new failure and says how the
// section ends: PROGRESSING (nil) while images are fetched and nothing
// failed, retried while any failure may mend or a fetch runs, else
// FAILED.
func (s *Section) report(failed map[string]failure, pending []string, total int) error {
	s.mu.Lock()
	var newly []string
	now := map[string]string{}
	for _, id := range pending {
		// Waiting for a fetch again: its last failure, if any, stands.
		if r, ok := s.failed[id]; ok {
			now[id] = r
		}
	}
	for id, f := range failed {
		now[id] = f.reason
		if s.failed[id] != f.reason {
			newly = append(newly, id)
		}
	}
	s.failed = now
	s.mu.Unlock()
	sort.Strings(newly)
	for _, id := range newly {
		if s.cfg.Event != nil {
			s.cfg.Event("InstanceFailed", map[string]any{"instance": id, "reason": failed[id].reason})
		}
	}
	if len(failed) == 0 {
		return nil
	}
	ids := make([]string, 0, len(failed))
	terminal := len(pending) == 0
	for id, f := range failed {
		ids = append(ids, id)
		terminal = terminal && f.terminal
	}
	sort.Strings(ids)
	var parts []string
	for _, id := range ids {
		parts = append(parts, id+": "+failed[id].reason)
	}
	err := fmt.Errorf("%d of %d instances failed: %s", len(failed), total, strings.Join(parts, "; "))
	if terminal {
		return converge.Terminal(err)
	}
	return err
}

// network loads the section's network policy when an instance has a
// NIC and returns what it says of each instance: nil to go on, or why the
// instance fails (its policy cannot be expressed, or nothing could be
// loaded).
func (s *Section) network(ctx context.Context, body json.RawMessage, all []spec.Instance) func(spec.Instance) *failure {
	nics := false
	for _, in := range all {
		nics = nics || len(in.NICs) > 0
	}
	if !nics {
		return func(spec.Instance) *failure { return nil }
	}
	var failed map[string]string
	err := errors.New("this host loads no network policy (bcd node runs without bcd helper): an instance with a NIC does not run unguarded")
	terminal := true
	if s.cfg.Network != nil {
		s.mu.Lock()
		proof := s.proof
		s.mu.Unlock()
		terminal = false
		if proof == nil {
			err = errors.New("no proof of the held spec yet")
		} else {
			failed, err = s.cfg.Network(ctx, body, *proof)
		}
	}
	return func(in spec.Instance) *failure {
		switch why, bad := failed[in.ID]; {
		case len(in.NICs) == 0:
			return nil
		case err != nil:
			return fail(terminal, "network policy: %v", err)
		case bad:
			return fail(true, "network policy: %s", why)
		}
		return nil
	}
}

// busy reports whether a snapshot holds instance id.
func (s *Section) busy(id string) bool { return s.cfg.Busy != nil && s.cfg.Busy(id) }

func fail(terminal bool, format string, args ...any) *failure {
	return &failure{reason: fmt.Sprintf(format, args...), terminal: terminal}
}

// ensure sets up one instance; each step finds what an earlier, maybe
// interrupted, pass left and goes on from there.
func (s *Section) ensure(ctx context.Context, in spec.Instance, st state) *failure {
	if d, ok := st.domains[in.ID]; ok && !d.Owned {
		return fail(true, "a domain bcd did not create is named %s; bcd leaves it alone", in.ID)
	}
	im := st.image(in)
	var base images.Base
	var man *snapshot.Manifest
	if in.RestoreFrom != nil {
		m, b, f := s.snapshot(*in.RestoreFrom)
		if f != nil {
			return f
		}
		if in.RestoreFrom.Memory {
			if why := m.Fits(in.VCPUs, in.MemoryMiB, snapshot.HostCPU()); why != "" {
				return fail(true, "restore_from: %s", why)
			}
		}
		base, man = b, &m
	} else {
		b, err := s.cfg.Images.Ready(im)
		if errors.Is(err, images.ErrNotFetched) {
			done, ferr := s.fetch(s.cfg.Images, im)
			switch {
			case !done:
				return &failure{reason: "fetching image " + im.SHA256, pending: true}
			case ferr != nil:
				return fail(errors.Is(ferr, images.ErrRefused), "%v", ferr)
			}
			b, err = s.cfg.Images.Ready(im)
		}
		if err != nil {
			return fail(errors.Is(err, images.ErrRefused), "%v", err)
		}
		base = b
	}
	if f := s.gpus(ctx, in); f != nil {
		return f
	}
	dir := filepath.Join(s.cfg.Dir, in.ID)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fail(false, "%v", err)
	}
	if f := s.disk(ctx, in, im, base, filepath.Join(dir, DiskFile)); f != nil {
		return f
	}
	if f := s.seed(ctx, in, filepath.Join(dir, SeedFile)); f != nil {
		return f
	}
	if _, err := s.cfg.Runtime.Ensure(ctx, machine(in, im)); err != nil {
		return fail(errors.Is(err, vmruntime.ErrForeign), "define: %v", err)
	}
	cur := orStopped(st.domains[in.ID].State)
	if r := in.RestoreFrom; r != nil && r.Memory {
		resumed, f := s.resume(ctx, in, im, *man, dir, cur)
		if f != nil {
			return f
		}
		if resumed {
			cur = vmruntime.Running
		}
		if cur != vmruntime.Stopped {
			if f := s.rebind(ctx, in, dir); f != nil {
				return f
			}
		}
	}
	if cur != in.State {
		if err := s.cfg.Runtime.SetState(ctx, in.ID, in.State); err != nil {
			return fail(false, "%s: %v", strings.ToLower(in.State), err)
		}
	}
	return nil
}

// fetch reports im's background fetch, starting it when none runs: a
// download can take long, and the sections after this one must not wait
// for it (the section is PROGRESSING meanwhile). A failed fetch is
// reported once and then forgotten, so a later pass tries again; a
// refused image stays refused while the section names it.
func (s *Section) fetch(store *images.Store, im spec.Image) (done bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.fetches[im.SHA256]
	if !ok {
		f = &fetchResult{}
		s.fetches[im.SHA256] = f
		go func() {
			err := store.Fetch(context.Background(), im)
			s.mu.Lock()
			f.done, f.err = true, err
			s.mu.Unlock()
		}()
		return false, nil
	}
	if f.done && (f.err == nil || !errors.Is(f.err, images.ErrRefused)) {
		delete(s.fetches, im.SHA256)
	}
	return f.done, f.err
}

// refused reports whether the image's fetch ended refused.
func (s *Section) refused(digest string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.fetches[digest]
	return ok && f.done && errors.Is(f.err, images.ErrRefused)
}

// forgetFetches drops what it knows of fetches of images the section no
// longer names (a fetch still running finishes on its own).
func (s *Section) forgetFetches(named map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for d, f := range s.fetches {
		if !named[d] && f.done {
			delete(s.fetches, d)
		}
	}
}

// disk creates the instance's disk once, through a temporary name so an
// interrupted creation is never taken for a disk, and checks its header
// every pass: an overlay of exactly its base, or, over an iso, a disk of
// its own.
func (s *Section) disk(ctx context.Context, in spec.Instance, im spec.Image, base images.Base, path string) *failure {
	want := s.backing(im)
	size := int64(in.DiskGiB) << 30
	if im.Format == spec.ISO {
		base = images.Base{}
	} else if size != 0 && size < base.VirtualSize {
		return fail(true, "disk_gib %d is below the base image's %d bytes", in.DiskGiB, base.VirtualSize)
	}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		tmp := path + ".new"
		os.Remove(tmp)
		if err := s.cfg.Disk(ctx, tmp, base, im.Format, size); err != nil {
			os.Remove(tmp)
			return fail(false, "create disk: %v", err)
		}
		// QEMU reaches the disk through the node's group.
		if err := os.Chmod(tmp, 0o660); err != nil {
			return fail(false, "create disk: %v", err)
		}
		if err := os.Rename(tmp, path); err != nil {
			return fail(false, "create disk: %v", err)
		}
	}
	if _, err := qcow2.CheckFile(path, want); err != nil {
		return fail(true, "instance disk refused: %v", err)
	}
	return nil
}

// backing is what an instance disk over im must name: its base (a
// base image, or a restored snapshot's disk), or nothing beside an iso.
func (s *Section) backing(im spec.Image) qcow2.Backing {
	switch {
	case im.Format == spec.ISO:
		return qcow2.Backing{}
	case im.URL == "" && s.cfg.Snapshots != nil:
		return qcow2.Backing{Path: filepath.Join(s.snapshotDir(im.SHA256), snapshot.DiskFile), Format: spec.QCOW2}
	}
	return qcow2.Backing{Path: s.cfg.Images.Path(im), Format: im.Format}
}

// seed writes the NoCloud seed once: cloud-init reads it at the
// instance's first boot.
func (s *Section) seed(ctx context.Context, in spec.Instance, path string) *failure {
	if _, err := os.Lstat(path); err == nil {
		return nil
	}
	sd := seed.Seed{InstanceID: in.ID, Hostname: in.Hostname}
	var err error
	if sd.Interfaces, err = seedInterfaces(in.NICs, bridgeAddrs); err != nil {
		return fail(true, "network-config: %v", err)
	}
	if in.UserData {
		ud, err := s.userData(ctx, in)
		if errors.Is(err, errNoUserData) {
			return fail(true, "%v", err)
		}
		if err != nil {
			// The error is the fetch's, never the data.
			return fail(false, "user data: %v", err)
		}
		sd.UserData = ud
	}
	if err := seed.WriteFile(path, sd); err != nil {
		return fail(true, "%v", err)
	}
	return nil
}

// QEMUImg creates a disk with qemu-img create: a qcow2 overlay over
// base in baseFormat (which qemu-img then opens as that format, never
// probing it), or an empty qcow2 when base.Path is "".
func QEMUImg(ctx context.Context, path string, base images.Base, baseFormat string, size int64) error {
	args := []string{"create", "-q", "-f", "qcow2"}
	if base.Path != "" {
		args = append(args, "-b", base.Path, "-F", baseFormat)
	}
	args = append(args, path)
	if size > 0 {
		args = append(args, strconv.FormatInt(size, 10))
	}
	out, err := exec.CommandContext(ctx, "qemu-img", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
