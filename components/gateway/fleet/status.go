package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Bounds of what the gateway keeps of its agents' reports.
const (
	// MaxStatusReport bounds a stored StatusReport (its protobuf size).
	MaxStatusReport = 1 << 20
	// MaxEvents is how many events are kept per node (the highest seqs).
	MaxEvents = 1000
	// MaxEventBody bounds an event body kept; a larger one is stored
	// without its body (its size noted).
	MaxEventBody = 64 << 10
)

// statusRecord is what the gateway stores of a node's latest StatusReport.
type statusRecord struct {
	ReceivedAt         time.Time                `json:"received_at"`
	AgentAt            int64                    `json:"at_unix_ms,omitempty"`
	ObservedGeneration uint64                   `json:"observed_generation"`
	AppliedGeneration  uint64                   `json:"applied_generation"`
	Sections           []adminapi.SectionView   `json:"section_states,omitempty"`
	Conditions         []adminapi.ConditionView `json:"conditions,omitempty"`
	Pressure           *adminapi.PressureView   `json:"pressure,omitempty"`
	WantFullSpec       bool                     `json:"want_full_spec,omitempty"`
	SpecError          string                   `json:"spec_error,omitempty"`
	RefusedGeneration  uint64                   `json:"refused_generation,omitempty"`
	// InventoryHashes are those of the latest report that carried any,
	// received at InventoryHashesAt.
	InventoryHashes   map[string]string `json:"inventory_hashes,omitempty"`
	InventoryHashesAt time.Time         `json:"inventory_hashes_at,omitzero"`
	// Inventory holds every inventory section reported so far (a report
	// carries the sections that changed); Report the role's report
	// sections (a site's images).
	Inventory json.RawMessage `json:"inventory,omitempty"`
	Report    json.RawMessage `json:"report,omitempty"`
}

func msTime(ms int64) *time.Time {
	if ms == 0 {
		return nil
	}
	t := time.UnixMilli(ms).UTC()
	return &t
}

// jsonObject reports whether b is empty or a JSON object.
func jsonObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || (b[0] == '{' && json.Valid(b))
}

// InventoryHashesOK bounds a map of inventory section hashes.
func InventoryHashesOK(h map[string]string) bool {
	if len(h) > 64 {
		return false
	}
	for k, v := range h {
		if len(k) > 128 || len(v) > 160 {
			return false
		}
	}
	return true
}

// MissingInventory names the inventory sections Welcome asks a node for,
// from its stored report record old: "*" when the gateway holds none of
// its inventory, else those whose hash it knows but whose content it
// lacks.
func MissingInventory(old []byte) []string {
	var prev statusRecord
	if len(old) == 0 || json.Unmarshal(old, &prev) != nil || len(prev.Inventory) == 0 {
		return []string{"*"}
	}
	inv := map[string]json.RawMessage{}
	_ = json.Unmarshal(prev.Inventory, &inv)
	var out []string
	for name := range prev.InventoryHashes {
		if _, ok := inv[name]; !ok {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// StoreStatus keeps a node's latest StatusReport, with the time it came.
// Inventory sections of earlier reports stay until a report replaces them.
// old is the node's report record as stored, when the caller knows it
// (known: a session read it at its set-up and keeps what it stored
// since); else it is read. A report that changes nothing but the time it
// came and was built is not stored again: every agent sends a report
// after each Welcome, so a reconnect would rewrite every node's record.
// The record as stored is returned.
func (s *Fleet) StoreStatus(node string, r *bcdv1.StatusReport, old []byte, known bool) ([]byte, error) {
	if n := proto.Size(r); n > MaxStatusReport {
		return old, fmt.Errorf("status report is %d bytes; at most %d (1 MiB)", n, MaxStatusReport)
	}
	if !jsonObject(r.GetSections()) {
		return old, errors.New("status report sections are not a JSON object")
	}
	if !jsonObject(r.GetInventory()) {
		return old, errors.New("status report inventory is not a JSON object")
	}
	if len(r.GetInventoryHashes()) > 0 && !InventoryHashesOK(r.GetInventoryHashes()) {
		return old, errors.New("status report inventory hashes are too many or too long")
	}
	if !known {
		var err error
		if old, err = s.store.Report(node); err != nil {
			return nil, err
		}
	}
	rec := statusRecord{
		ReceivedAt: s.now().UTC(), AgentAt: r.GetAtUnixMs(),
		ObservedGeneration: r.GetObservedGeneration(), AppliedGeneration: r.GetAppliedGeneration(),
		WantFullSpec: r.GetWantFullSpec(), SpecError: r.GetSpecError(), RefusedGeneration: r.GetRefusedGeneration(),
		Report: bytes.TrimSpace(r.GetSections()),
	}
	if len(r.GetInventoryHashes()) > 0 {
		rec.InventoryHashes, rec.InventoryHashesAt = maps.Clone(r.GetInventoryHashes()), rec.ReceivedAt
	}
	for _, x := range r.GetSectionStates() {
		rec.Sections = append(rec.Sections, adminapi.SectionView{Name: x.GetName(), State: x.GetState(), Generation: x.GetGeneration(),
			Message: x.GetMessage(), Changes: x.GetChanges(), Since: msTime(x.GetSinceUnixMs()), Attempts: x.GetAttempts()})
	}
	for _, c := range r.GetConditions() {
		rec.Conditions = append(rec.Conditions, adminapi.ConditionView{Type: c.GetType(), Subject: c.GetSubject(), Reason: c.GetReason(),
			Message: c.GetMessage(), Since: msTime(c.GetSinceUnixMs()), Count: c.GetCount()})
	}
	if p := r.GetPressure(); p != nil {
		rec.Pressure = &adminapi.PressureView{Available: p.GetAvailable(), CPUSomeAvg10: p.GetCpuSomeAvg10(), CPUSomeAvg60: p.GetCpuSomeAvg60(),
			MemorySomeAvg10: p.GetMemorySomeAvg10(), MemoryFullAvg10: p.GetMemoryFullAvg10(), IOSomeAvg10: p.GetIoSomeAvg10(),
			IOFullAvg10: p.GetIoFullAvg10(), CPUStealPercent: p.GetCpuStealPercent(), At: msTime(p.GetAtUnixMs())}
	}
	// Merge the inventory sections onto those kept from earlier reports,
	// and keep their hashes until a report carries new ones.
	inv := map[string]json.RawMessage{}
	var prev statusRecord
	prevOK := len(old) > 0 && json.Unmarshal(old, &prev) == nil
	if prevOK {
		if len(prev.Inventory) > 0 {
			_ = json.Unmarshal(prev.Inventory, &inv)
		}
		if rec.InventoryHashes == nil {
			rec.InventoryHashes, rec.InventoryHashesAt = prev.InventoryHashes, prev.InventoryHashesAt
		}
	}
	if len(bytes.TrimSpace(r.GetInventory())) > 0 {
		var now map[string]json.RawMessage
		_ = json.Unmarshal(r.GetInventory(), &now)
		maps.Copy(inv, now)
	}
	if len(inv) > 0 {
		b, _ := json.Marshal(inv)
		if len(b) > MaxStatusReport {
			// Kept sections and new ones together are too large: keep only
			// this report's.
			b = bytes.TrimSpace(r.GetInventory())
		}
		rec.Inventory = b
	}
	if prevOK {
		// The same record but for its times (when it came, when the agent
		// built it, when its unchanged pressure was sampled): kept as it
		// is. The agent builds a new report for each Welcome.
		same := rec
		same.ReceivedAt, same.AgentAt = prev.ReceivedAt, prev.AgentAt
		if maps.Equal(same.InventoryHashes, prev.InventoryHashes) {
			same.InventoryHashesAt = prev.InventoryHashesAt
		}
		if same.Pressure != nil && prev.Pressure != nil {
			p := *same.Pressure
			p.At = prev.Pressure.At
			same.Pressure = &p
		}
		if b, err := json.Marshal(same); err == nil && bytes.Equal(b, old) {
			return old, nil
		}
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return old, err
	}
	if err := s.store.PutReport(node, b); err != nil {
		return old, err
	}
	return b, nil
}

// StoreEvent stores an agent's event once per seq (a copy is acked and
// not stored again), keeping the last MaxEvents of the node.
func (s *Fleet) StoreEvent(node string, e *bcdv1.Event, log interface{ Warn(string, ...any) }) error {
	rec := store.Event{Seq: e.GetSeq(), Type: e.GetType(), Body: e.GetBody(), AtUnixMS: e.GetAtUnixMs(), ReceivedAt: s.now().UTC()}
	if len(rec.Body) > MaxEventBody {
		log.Warn("event body too large; stored without it", "seq", rec.Seq, "type", rec.Type, "bytes", len(rec.Body))
		rec.Body, rec.BodyDropped = nil, len(e.GetBody())
	}
	_, err := s.store.AddEvent(node, rec, MaxEvents)
	return err
}

func viewEvent(e store.Event) adminapi.EventView {
	v := adminapi.EventView{Seq: e.Seq, Type: e.Type, ReceivedAt: e.ReceivedAt, BodyDropped: e.BodyDropped}
	if e.AtUnixMS != 0 {
		v.At = time.UnixMilli(e.AtUnixMS).UTC()
	}
	if json.Valid(e.Body) {
		v.Body = e.Body
	} else if len(e.Body) > 0 {
		v.Body, _ = json.Marshal(string(e.Body))
	}
	return v
}

// Events returns a node's stored events with a seq above after, oldest
// first.
func (s *Fleet) Events(node string, after uint64) ([]adminapi.EventView, error) {
	evs, err := s.store.Events(node, after)
	if err != nil {
		return nil, err
	}
	out := make([]adminapi.EventView, 0, len(evs))
	for _, e := range evs {
		out = append(out, viewEvent(e))
	}
	return out, nil
}

// Status returns a node's status view.
func (s *Fleet) Status(node string) (adminapi.StatusView, error) {
	n, err := s.store.Node(node)
	if err != nil {
		return adminapi.StatusView{}, fmt.Errorf("node %s: %w (bcgw nodes lists the nodes this gateway knows)", node, err)
	}
	sp, err := s.store.Spec(node)
	if err != nil {
		return adminapi.StatusView{}, err
	}
	v := adminapi.StatusView{
		Node: n.ID, Role: n.Role, Site: n.Site, LastSeen: n.LastSeen,
		SpecGeneration: sp.Generation, AppliedGeneration: n.AppliedGeneration, ObservedGeneration: n.ObservedGeneration,
		Sections: []adminapi.SectionView{}, Conditions: []adminapi.ConditionView{},
	}
	v.Gateway, v.Connected = s.SessionOn(n)
	if v.Upgrade, err = s.upgradeView(node); err != nil {
		return v, err
	}
	if len(n.InventoryHashes) > 0 {
		v.InventoryHashes = n.InventoryHashes
		at := n.InventoryHashesAt
		v.InventoryHashesAt = &at
	}
	b, err := s.store.Report(node)
	if err != nil {
		return v, err
	}
	if len(b) == 0 {
		return v, nil
	}
	var rec statusRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return v, fmt.Errorf("stored status report of %s: %w", node, err)
	}
	at := rec.ReceivedAt
	v.ReportAt = &at
	if !rec.ReceivedAt.Before(n.LastSeen) {
		// The report is newer than the last Hello or Heartbeat.
		v.AppliedGeneration, v.ObservedGeneration = rec.AppliedGeneration, rec.ObservedGeneration
	}
	v.RefusedGeneration, v.SpecError = rec.RefusedGeneration, rec.SpecError
	if rec.Sections != nil {
		v.Sections = rec.Sections
	}
	if rec.Conditions != nil {
		v.Conditions = rec.Conditions
	}
	v.Pressure, v.Inventory, v.Report = rec.Pressure, rec.Inventory, rec.Report
	if len(rec.InventoryHashes) > 0 && (v.InventoryHashesAt == nil || rec.InventoryHashesAt.After(*v.InventoryHashesAt)) {
		hat := rec.InventoryHashesAt
		v.InventoryHashes, v.InventoryHashesAt = rec.InventoryHashes, &hat
	}
	return v, nil
}
