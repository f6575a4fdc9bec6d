// Package report builds an agent's StatusReports and the extra fields of
// its heartbeats and Hello: the converge engine's generations and section
// states, the machine's conditions, pressure and inventory, and the role's
// own report sections (a site's image cache). A report is complete, built
// when something changed, at most once every MinInterval (changes in
// between are coalesced into the next), and once right after each Welcome.
//
// Inventory travels in two ways: heartbeats carry the section hashes on
// every 10th beat of a session and on the first beat after a hash changed;
// reports carry the sections themselves that the gateway asked for in
// Welcome.requested_sections ("*" for all) and any section whose hash
// changed since this agent last sent it.
package report

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Machine is what a role knows about its machine; any field may be nil.
type Machine struct {
	Conditions func() []*bcdv1.Condition
	Pressure   func() *bcdv1.Pressure
	// Inventory returns the latest inventory's sections (canonical JSON)
	// and their hashes, nil before the first collection.
	Inventory func() (sections map[string]json.RawMessage, hashes map[string]string)
}

// Config configures a Reporter.
type Config struct {
	// Status is the converge engine's status (nil: none).
	Status  func() converge.Status
	Machine Machine
	// Publish hands a report to the session (session.Report).
	Publish func(*bcdv1.StatusReport)
	// Now is the working clock; default time.Now.
	Now func() time.Time
	// MinInterval between two reports (default 2 s).
	MinInterval time.Duration
	Log         *slog.Logger
	// TrustTaken, when set, returns a trust bundle version taken since it
	// was last called, acknowledged once in the next report.
	TrustTaken func() uint64
}

// Reporter builds and publishes reports.
type Reporter struct {
	cfg  Config
	kick chan struct{}

	mu        sync.Mutex
	sections  []byte            // the role's report sections, a JSON object
	sent      map[string]string // inventory section -> hash last sent in a report
	requested map[string]bool   // sections asked for in this session's Welcome
	all       bool              // Welcome asked for every section
	beatSent  map[string]string // hashes last sent in a heartbeat
	last      time.Time         // when the last report was published
}

// New makes a Reporter; Run publishes its reports.
func New(cfg Config) *Reporter {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Reporter{cfg: cfg, kick: make(chan struct{}, 1), sent: map[string]string{}, requested: map[string]bool{}}
}

// SetSections sets the role's report sections (a JSON object) and
// reports them.
func (r *Reporter) SetSections(b []byte) {
	r.mu.Lock()
	r.sections = append([]byte(nil), b...)
	r.mu.Unlock()
	r.Changed()
}

// Changed asks for a report; several in MinInterval make one.
func (r *Reporter) Changed() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run publishes a report after each Changed, at most once every
// MinInterval, until ctx ends.
func (r *Reporter) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		}
		r.mu.Lock()
		wait := r.cfg.MinInterval - time.Since(r.last)
		r.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
		}
		// Kicks that came while waiting are in this report.
		select {
		case <-r.kick:
		default:
		}
		r.publish()
	}
}

func (r *Reporter) publish() {
	rep := r.Build()
	r.mu.Lock()
	r.last = time.Now()
	r.mu.Unlock()
	if r.cfg.Publish != nil {
		r.cfg.Publish(rep)
	}
}

// Welcome starts a session's reporting: the sections it requests go out
// in full in the report published now.
func (r *Reporter) Welcome(w *bcdv1.Welcome) {
	r.mu.Lock()
	r.requested = map[string]bool{}
	r.all = false
	for _, s := range w.GetRequestedSections() {
		if s == "*" {
			r.all = true
		}
		r.requested[s] = true
	}
	r.beatSent = nil
	r.mu.Unlock()
	r.publish()
}

// Build returns the report as of now and marks the inventory sections it
// carries as sent.
func (r *Reporter) Build() *bcdv1.StatusReport {
	rep := &bcdv1.StatusReport{}
	if r.cfg.Status != nil {
		rep = r.cfg.Status().Proto()
	}
	m := r.cfg.Machine
	if m.Conditions != nil {
		rep.Conditions = m.Conditions()
	}
	if m.Pressure != nil {
		rep.Pressure = m.Pressure()
	}
	rep.AtUnixMs = r.cfg.Now().UnixMilli()
	if r.cfg.TrustTaken != nil {
		rep.TrustVersion = r.cfg.TrustTaken()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rep.Sections = r.sections
	if m.Inventory != nil {
		secs, hashes := m.Inventory()
		rep.InventoryHashes = hashes
		out := map[string]json.RawMessage{}
		for name, h := range hashes {
			if r.all || r.requested[name] || r.sent[name] != h {
				if b, ok := secs[name]; ok {
					out[name] = b
				}
			}
		}
		if len(out) > 0 {
			b, err := json.Marshal(out)
			if err == nil {
				rep.Inventory = b
				for name := range out {
					r.sent[name] = hashes[name]
				}
			}
		}
		// What this session asked for is sent now; later reports carry
		// only what changed.
		r.all = false
		r.requested = map[string]bool{}
	}
	return rep
}

// Hello adds the generations to a Hello.
func (r *Reporter) Hello(h *bcdv1.Hello) {
	if r.cfg.Status != nil {
		st := r.cfg.Status()
		h.AppliedGeneration, h.ObservedGeneration = st.Applied, st.Observed
	}
}

// Heartbeat adds the generations to a heartbeat and, on every 10th beat
// of a session and the first after a change, the inventory hashes.
func (r *Reporter) Heartbeat(hb *bcdv1.Heartbeat, beat int) {
	if r.cfg.Status != nil {
		st := r.cfg.Status()
		hb.AppliedGeneration, hb.ObservedGeneration = st.Applied, st.Observed
	}
	if r.cfg.Machine.Inventory == nil {
		return
	}
	_, hashes := r.cfg.Machine.Inventory()
	if len(hashes) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if beat%10 == 0 || !maps.Equal(hashes, r.beatSent) {
		hb.InventoryHashes = hashes
		r.beatSent = maps.Clone(hashes)
	}
}
