// Package health watches the node's own health for its StatusReports: the
// NVIDIA Xid errors of this boot as conditions, the host's pressure (PSI
// and CPU steal), and the inventory's sections and their hashes.
//
// A Monitor runs beside the agent's session (Run). It reads through the
// node's nodekinds.Hardware, so a fakehw build watches its fake machine
// (Xids appended to data_dir/fakehw/kmsg) and the host build the real one
// (/dev/kmsg, procfs, sysfs, nvidia-smi). It never talks to the gateway
// itself: it calls changed() and the agent reads Conditions, Pressure and
// Inventory for its next report.
package health

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/machine/inventory"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/machine/nvsmi"
	"github.com/better-compute/bcd/components/machine/pressure"
	"github.com/better-compute/bcd/components/machine/xid"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// The intervals a zero Config field stands for.
const (
	DefaultXIDPoll        = 2 * time.Second
	DefaultInventoryEvery = 10 * time.Minute
	DefaultBurstDelay     = 2 * time.Second
	DefaultPressureEvery  = 30 * time.Second
)

// Bounds on one call into the Hardware, so a hung nvidia-smi or log read
// cannot stop the monitor for good.
const (
	xidTimeout       = 30 * time.Second
	inventoryTimeout = 5 * time.Minute
)

// The types of the conditions a Monitor reports: a GPU with Xid errors
// this boot, a GPU health check that failed (the GPU takes no new work
// until the action is done) and one that warned.
const (
	ConditionXid          = "Xid"
	ConditionCheckFailed  = "GPUCheckFailed"
	ConditionCheckWarning = "GPUCheckWarning"
)

// Config is what a Monitor watches and how often.
type Config struct {
	// HW is the machine: Inventory and XIDs are read.
	HW nodekinds.Hardware
	// Pressure samples PSI and steal; nil: no pressure.
	Pressure *pressure.Sampler
	// Log gets errors and recoveries (component "health"); nil:
	// slog.Default().
	Log *slog.Logger
	// Intervals (zero = default): XIDs are polled every XIDPoll (2s), the
	// inventory collected every InventoryEvery (10m) and BurstDelay (2s)
	// after new Xids arrived, pressure sampled every PressureEvery (30s).
	XIDPoll, InventoryEvery, BurstDelay, PressureEvery time.Duration
	// Now is the clock of SinceUnixMs and the pressure samples; nil:
	// time.Now.
	Now func() time.Time
}

// Monitor keeps the node's latest conditions, pressure and inventory. Its
// readers are safe for concurrent use with Run and each other.
type Monitor struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	conds []*bcdv1.Condition
	since map[string]int64 // condition subject -> first seen (unix ms)
	// checkSince: "subject/check" -> first seen, for the check conditions.
	checkSince map[string]int64
	xids       []nvsmi.XID // the last XIDs read, to resolve again after an inventory
	built      bool        // the conditions were built at least once
	press      *bcdv1.Pressure
	gpus       []inventory.GPU
	sections   map[string]json.RawMessage
	hashes     map[string]string

	// Run's own state.
	seen    map[nvsmi.XID]int // the XIDs of the last poll, counted
	lastErr map[string]string // source -> the error logged last
}

// New returns a Monitor of cfg; Run starts it.
func New(cfg Config) *Monitor {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.XIDPoll, DefaultXIDPoll)
	def(&cfg.InventoryEvery, DefaultInventoryEvery)
	def(&cfg.BurstDelay, DefaultBurstDelay)
	def(&cfg.PressureEvery, DefaultPressureEvery)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	return &Monitor{
		cfg:     cfg,
		log:     log.With("component", "health"),
		since:   map[string]int64{},
		lastErr: map[string]string{},
	}
}

// Run collects the inventory once at start, then polls XIDs every XIDPoll,
// collects the inventory again every InventoryEvery and BurstDelay after
// new XIDs arrived (one collection per burst: XIDs arriving while one is
// pending are covered by it), samples pressure every PressureEvery, and
// calls changed() whenever conditions, pressure (its values, not its
// timestamp) or an inventory section hash changed; changed runs on Run's
// goroutine, without the Monitor's lock held, so it may read the Monitor.
// Errors are logged, once until they change or clear, never fatal. Run
// returns nil when ctx ends; call it once per Monitor.
func (m *Monitor) Run(ctx context.Context, changed func()) error {
	if m.cfg.HW == nil {
		return errors.New("health: no Hardware to watch")
	}
	notify := func(c bool) {
		if c && changed != nil && ctx.Err() == nil {
			changed()
		}
	}
	c := m.collectInventory(ctx)
	_, x := m.pollXIDs(ctx)
	p := m.samplePressure()
	notify(c || x || p)

	xidTick := time.NewTicker(m.cfg.XIDPoll)
	defer xidTick.Stop()
	invTick := time.NewTicker(m.cfg.InventoryEvery)
	defer invTick.Stop()
	var pressTick <-chan time.Time
	if m.cfg.Pressure != nil {
		t := time.NewTicker(m.cfg.PressureEvery)
		defer t.Stop()
		pressTick = t.C
	}
	var (
		burst  *time.Timer
		burstC <-chan time.Time
	)
	defer func() {
		if burst != nil {
			burst.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-xidTick.C:
			arrived, c := m.pollXIDs(ctx)
			if arrived && burstC == nil {
				burst = time.NewTimer(m.cfg.BurstDelay)
				burstC = burst.C
			}
			notify(c)
		case <-burstC:
			burst, burstC = nil, nil
			notify(m.collectInventory(ctx))
		case <-invTick.C:
			notify(m.collectInventory(ctx))
		case <-pressTick:
			notify(m.samplePressure())
		}
	}
}

// Conditions returns one "Xid" condition per GPU with XIDs this boot:
// Subject the GPU's UUID (from the latest inventory, matched by PCI bus
// id; the bus id when the inventory does not know it), Reason "Xid <code>"
// and Message of its latest XID with what NVIDIA documents it to mean and
// recommends (XIDMessage), SinceUnixMs when this Monitor first saw the GPU
// with XIDs (kept while it has them), Count its XIDs; and one
// GPUCheckFailed or GPUCheckWarning condition per health check (nvsmi) that
// failed or warned on a GPU of the latest inventory, with the action. They
// are sorted by subject, type and reason, and are copies.
func (m *Monitor) Conditions() []*bcdv1.Condition {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*bcdv1.Condition, len(m.conds))
	for i, c := range m.conds {
		out[i] = proto.Clone(c).(*bcdv1.Condition)
	}
	return out
}

// Unhealthy reports whether the GPU uuid takes no new work, and why: an Xid
// this boot that NVIDIA's table counts as a failure (xid.Lookup), or a
// failed health check. Xids that only warn (an application's fault) leave
// it in service.
func (m *Monitor) Unhealthy(uuid string) (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.conds {
		if c.GetSubject() != uuid {
			continue
		}
		if c.GetType() == ConditionCheckFailed {
			return true, c.GetReason() + ": " + c.GetMessage()
		}
	}
	for _, x := range m.xids {
		subject, _ := resolve(x, m.gpus)
		if info, _ := xid.Lookup(x.Code); subject == uuid && info.Severity == xid.Fail {
			return true, info.Describe()
		}
	}
	return false, ""
}

// Pressure returns a copy of the latest sample, or nil (no Sampler, or
// none taken yet).
func (m *Monitor) Pressure() *bcdv1.Pressure {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.press == nil {
		return nil
	}
	return proto.Clone(m.press).(*bcdv1.Pressure)
}

// Inventory returns the latest inventory's sections (name -> canonical
// JSON, as inventory.Inventory.Sections gives them) and hashes (name ->
// "sha256:<hex>", as Hashes gives them); nil, nil before the first
// collection. The maps are the caller's; the JSON bytes are shared and
// must not be modified.
func (m *Monitor) Inventory() (sections map[string]json.RawMessage, hashes map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hashes == nil {
		return nil, nil
	}
	return maps.Clone(m.sections), maps.Clone(m.hashes)
}

// collectInventory reads the inventory and reports whether a section hash
// or a condition (whose subjects the GPUs name) changed.
func (m *Monitor) collectInventory(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, inventoryTimeout)
	defer cancel()
	inv, err := m.cfg.HW.Inventory(cctx)
	if ctx.Err() != nil {
		return false // shutting down
	}
	if err == nil && inv == nil {
		err = errors.New("no inventory")
	}
	m.report("inventory", err)
	if err != nil {
		return false
	}
	secs := inv.Sections()
	sections := make(map[string]json.RawMessage, len(secs))
	hashes := make(map[string]string, len(secs))
	for name, b := range secs {
		sections[name] = b
		hashes[name] = inventory.HashBytes(b)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := m.hashes == nil || !maps.Equal(m.hashes, hashes)
	m.sections, m.hashes = sections, hashes
	m.gpus = slices.Clone(inv.GPUs)
	return m.updateConditions() || changed
}

// pollXIDs reads the XIDs and reports whether new ones arrived (an XID
// more often than the poll before; never on the first poll) and whether
// the conditions changed. A read that failed with nothing keeps the
// conditions as they were.
func (m *Monitor) pollXIDs(ctx context.Context) (arrived, changed bool) {
	cctx, cancel := context.WithTimeout(ctx, xidTimeout)
	defer cancel()
	xids, err := m.cfg.HW.XIDs(cctx)
	if ctx.Err() != nil {
		return false, false // shutting down
	}
	m.report("xid", err)
	if err != nil && len(xids) == 0 {
		return false, false
	}
	counts := make(map[nvsmi.XID]int, len(xids))
	for _, x := range xids {
		counts[x]++
	}
	if m.seen != nil {
		for x, n := range counts {
			if n > m.seen[x] {
				arrived = true
				break
			}
		}
	}
	m.seen = counts
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.built && slices.Equal(xids, m.xids) {
		// The conditions are built from the XIDs and the inventory alone
		// (the times in them are when each was first seen): the same XIDs
		// as the last poll's give the same conditions. Rebuilding them
		// every 2 s was most of an idle agent's CPU.
		return arrived, false
	}
	m.xids = slices.Clone(xids)
	return arrived, m.updateConditions()
}

// updateConditions rebuilds the conditions from the last XIDs and GPUs and
// reports whether they changed. The caller holds m.mu.
func (m *Monitor) updateConditions() bool {
	now := m.cfg.Now().UnixMilli()
	conds, since := buildConditions(m.xids, m.gpus, m.since, now)
	checks, checkSince := checkConditions(m.gpus, m.checkSince, now)
	conds = append(conds, checks...)
	slices.SortStableFunc(conds, func(a, b *bcdv1.Condition) int {
		return cmp.Or(cmp.Compare(a.Subject, b.Subject), cmp.Compare(a.Type, b.Type), cmp.Compare(a.Reason, b.Reason))
	})
	m.checkSince = checkSince
	changed := len(conds) != len(m.conds)
	for i := 0; !changed && i < len(conds); i++ {
		changed = !proto.Equal(conds[i], m.conds[i])
	}
	m.conds, m.since, m.built = conds, since, true
	return changed
}

// samplePressure takes a sample and reports whether its values differ
// from the last one's.
func (m *Monitor) samplePressure() bool {
	if m.cfg.Pressure == nil {
		return false
	}
	p, err := m.cfg.Pressure.Read(m.cfg.Now())
	m.report("pressure", err)
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := m.press == nil || !samePressure(m.press, p)
	m.press = p
	return changed
}

func samePressure(a, b *bcdv1.Pressure) bool {
	a, b = proto.Clone(a).(*bcdv1.Pressure), proto.Clone(b).(*bcdv1.Pressure)
	a.AtUnixMs, b.AtUnixMs = 0, 0
	return proto.Equal(a, b)
}

// report logs err of source when it differs from the one logged last, and
// the recovery when a failing source succeeds again.
func (m *Monitor) report(source string, err error) {
	last, failing := m.lastErr[source]
	switch {
	case err == nil && failing:
		delete(m.lastErr, source)
		m.log.Info("health source recovered", "source", source, "after", last)
	case err != nil && err.Error() != last:
		m.lastErr[source] = err.Error()
		m.log.Warn("health source failed", "source", source, "err", err)
	}
}

// buildConditions groups xids by GPU into one Xid condition each, sorted
// by subject. since maps a subject to when it was first seen; a subject
// not in it is first seen at now (or when the same GPU was first seen
// under its bus id, before an inventory named it). It returns the
// conditions and the first-seen times of their subjects.
func buildConditions(xids []nvsmi.XID, gpus []inventory.GPU, since map[string]int64, now int64) ([]*bcdv1.Condition, map[string]int64) {
	type group struct {
		cond    *bcdv1.Condition
		aliases []string
	}
	groups := map[string]*group{}
	for _, x := range xids {
		subject, aliases := resolve(x, gpus)
		g := groups[subject]
		if g == nil {
			g = &group{cond: &bcdv1.Condition{Type: ConditionXid, Subject: subject}}
			groups[subject] = g
		}
		for _, a := range aliases {
			if a != "" && a != subject && !slices.Contains(g.aliases, a) {
				g.aliases = append(g.aliases, a)
			}
		}
		g.cond.Reason = fmt.Sprintf("Xid %d", x.Code)
		g.cond.Message = XIDMessage(x)
		if g.cond.Count < ^uint32(0) {
			g.cond.Count++
		}
	}
	out := make([]*bcdv1.Condition, 0, len(groups))
	next := make(map[string]int64, len(groups))
	for subject, g := range groups {
		at, ok := since[subject]
		for _, a := range g.aliases {
			if ok {
				break
			}
			at, ok = since[a]
		}
		if !ok {
			at = now
		}
		g.cond.SinceUnixMs = at
		next[subject] = at
		out = append(out, g.cond)
	}
	slices.SortFunc(out, func(a, b *bcdv1.Condition) int { return cmp.Compare(a.Subject, b.Subject) })
	return out, next
}

// XIDMessage is an Xid condition's message: the driver's text, then what
// NVIDIA documents the Xid to mean and the action it recommends (package
// xid's table), so the condition says what to do.
func XIDMessage(x nvsmi.XID) string {
	info, _ := xid.Lookup(x.Code)
	what := fmt.Sprintf("%s; action: %s", info.Meaning, info.Action)
	if x.Message == "" {
		return what
	}
	return x.Message + " (" + what + ")"
}

// checkConditions are the conditions of the GPU health checks other than
// xid.recent (the Xid conditions say that): one per check that warned or
// failed on a GPU the inventory knows, Type ConditionCheckFailed or
// ConditionCheckWarning, Subject the GPU, Reason the check, Message its
// reason and the action. since maps "subject/check" to when it was first
// seen; it returns the conditions and the times of their keys.
func checkConditions(gpus []inventory.GPU, since map[string]int64, now int64) ([]*bcdv1.Condition, map[string]int64) {
	var smi []nvsmi.GPU
	for _, g := range gpus {
		if g.SMI != nil {
			smi = append(smi, nvsmi.GPU{Info: *g.SMI})
		}
	}
	var out []*bcdv1.Condition
	next := map[string]int64{}
	for _, f := range nvsmi.CheckAll(smi, nil) {
		if f.Status == nvsmi.StatusPass || f.Check == nvsmi.CheckXIDRecent {
			continue
		}
		c := &bcdv1.Condition{Type: ConditionCheckWarning, Subject: f.GPU, Reason: f.Check, Message: f.Reason, Count: 1}
		if f.Status == nvsmi.StatusFail {
			c.Type = ConditionCheckFailed
		}
		if f.Action != "" {
			c.Message += "; action: " + f.Action
		}
		key := f.GPU + "/" + f.Check
		at, ok := since[key]
		if !ok {
			at = now
		}
		c.SinceUnixMs, next[key] = at, at
		out = append(out, c)
	}
	return out, next
}

// resolve names the GPU of an XID: the inventory's UUID of the GPU it
// names (by UUID, or by PCI address without the function), else its UUID,
// else its normalized bus id ("0000:17:00"), else "unknown". aliases are
// the other names the same GPU may have had.
func resolve(x nvsmi.XID, gpus []inventory.GPU) (subject string, aliases []string) {
	dev := device(x.PCIBusID)
	for _, g := range gpus {
		if g.UUID == "" {
			continue
		}
		if (x.UUID != "" && x.UUID == g.UUID) || (x.UUID == "" && dev != "" && dev == device(g.PCIBusID)) {
			return g.UUID, []string{dev, device(g.PCIBusID)}
		}
	}
	switch {
	case x.UUID != "":
		return x.UUID, []string{dev}
	case dev != "":
		return dev, nil
	}
	return "unknown", nil
}

// device normalizes a PCI address and drops its function: the kernel
// writes "0000:17:00", nvidia-smi "00000000:17:00.0", sysfs
// "0000:17:00.0".
func device(busID string) string {
	s := strings.TrimSpace(busID)
	if len(s) >= 4 && strings.EqualFold(s[:4], "pci:") {
		s = s[4:]
	}
	d, _, _ := strings.Cut(nvsmi.NormalizeBusID(s), ".")
	return d
}
