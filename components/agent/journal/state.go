package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/bcd/components/agent/journal/wal"
)

// state is the journal in memory: what a snapshot holds, and what replaying
// the log after it rebuilds. Entries are never changed in place (a change
// stores a new one), so two states may share them.
type state struct {
	node     string
	entries  map[string]*Entry
	open     map[string]struct{} // accepted or running: what a restart runs or settles
	unacked  map[string]struct{} // done, result not acked: what goes out after each Welcome
	events   []Event             // unacked, oldest first
	eventSeq uint64
	eventAck uint64
	dropped  uint64
	bytes    int64 // about what a snapshot of this state takes
	// importedFrom is the SHA-256 (hex) of the legacy journal.db this
	// journal was imported from, kept in every snapshot's head: an Open
	// that finds journal.db beside a snapshot tells by it whether the file
	// changed since (files.go, load).
	importedFrom string
}

func newState(node string) *state {
	return &state{node: node, entries: map[string]*Entry{}, open: map[string]struct{}{}, unacked: map[string]struct{}{}}
}

func (s *state) clone() *state {
	c := *s
	c.entries = make(map[string]*Entry, len(s.entries))
	for k, v := range s.entries {
		c.entries[k] = v
	}
	c.open = make(map[string]struct{}, len(s.open))
	for k := range s.open {
		c.open[k] = struct{}{}
	}
	c.unacked = make(map[string]struct{}, len(s.unacked))
	for k := range s.unacked {
		c.unacked[k] = struct{}{}
	}
	c.events = slices.Clone(s.events)
	return &c
}

// change is one record of the log: what one write changed. It is also the
// unit of a snapshot (a head, an entry or an event per record, then an
// end). Its parts apply in the order of the fields.
type change struct {
	Head  *head    `json:"head,omitempty"`   // a snapshot's first record
	Del   []string `json:"del,omitempty"`    // entries swept
	Put   *Entry   `json:"put,omitempty"`    // an entry stored whole
	Event *Event   `json:"event,omitempty"`  // an event appended
	Drop  int      `json:"drop,omitempty"`   // the oldest unacked events dropped by the cap
	AckTo uint64   `json:"ack_to,omitempty"` // events up to this seq acked
	End   *end     `json:"end,omitempty"`    // a snapshot's last record
}

type head struct {
	Node     string `json:"node"`
	EventSeq uint64 `json:"event_seq,omitempty"`
	EventAck uint64 `json:"event_ack,omitempty"`
	Dropped  uint64 `json:"events_dropped,omitempty"`
	Imported string `json:"imported_sha256,omitempty"`
}

type end struct {
	Entries int `json:"entries"`
	Events  int `json:"events"`
}

// entrySize is about what an entry takes in a snapshot.
func entrySize(e *Entry) int64 {
	return int64(200 + len(e.ID) + len(e.Kind) + len(e.Lane) + 4*(len(e.Command)+len(e.Result))/3)
}

func eventSize(e *Event) int64 { return int64(80 + len(e.Type) + 4*len(e.Body)/3) }

func (s *state) apply(c *change) {
	if h := c.Head; h != nil {
		s.node, s.eventSeq, s.eventAck, s.dropped, s.importedFrom = h.Node, h.EventSeq, h.EventAck, h.Dropped, h.Imported
	}
	for _, id := range c.Del {
		s.remove(id)
	}
	if e := c.Put; e != nil {
		s.remove(e.ID)
		s.entries[e.ID] = e
		s.bytes += entrySize(e)
		if e.State == Accepted || e.State == Running {
			s.open[e.ID] = struct{}{}
		}
		if e.State == Done && !e.Acked {
			s.unacked[e.ID] = struct{}{}
		}
	}
	if e := c.Event; e != nil {
		s.events = append(s.events, *e)
		s.eventSeq = max(s.eventSeq, e.Seq)
		s.bytes += eventSize(e)
	}
	if c.Drop > 0 {
		n := min(c.Drop, len(s.events))
		s.dropEvents(n)
		s.dropped += uint64(n)
	}
	if c.AckTo > s.eventAck {
		s.eventAck = c.AckTo
		n := 0
		for n < len(s.events) && s.events[n].Seq <= c.AckTo {
			n++
		}
		s.dropEvents(n)
	}
}

func (s *state) remove(id string) {
	if old := s.entries[id]; old != nil {
		s.bytes -= entrySize(old)
		delete(s.entries, id)
		delete(s.open, id)
		delete(s.unacked, id)
	}
}

func (s *state) dropEvents(n int) {
	for i := range n {
		s.bytes -= eventSize(&s.events[i])
	}
	s.events = s.events[n:]
}

// snapshotRecords encodes s as a snapshot: a head, every entry, every
// event, an end that counts them.
func (s *state) snapshotRecords() ([][]byte, error) {
	out := make([][]byte, 0, len(s.entries)+len(s.events)+2)
	add := func(c *change) error {
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		out = append(out, b)
		return nil
	}
	if err := add(&change{Head: &head{Node: s.node, EventSeq: s.eventSeq, EventAck: s.eventAck, Dropped: s.dropped, Imported: s.importedFrom}}); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(s.entries))
	for id := range s.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if err := add(&change{Put: s.entries[id]}); err != nil {
			return nil, err
		}
	}
	for i := range s.events {
		if err := add(&change{Event: &s.events[i]}); err != nil {
			return nil, err
		}
	}
	if err := add(&change{End: &end{Entries: len(ids), Events: len(s.events)}}); err != nil {
		return nil, err
	}
	return out, nil
}

var states = map[string]bool{Accepted: true, Running: true, Done: true}

// checkEntry refuses an entry no write of the journal would store.
func checkEntry(e *Entry) error {
	if e.ID == "" || !states[e.State] {
		return fmt.Errorf("an entry with id %q in state %q", e.ID, e.State)
	}
	return nil
}

// decodeChange reads one record and checks it holds one thing a write or
// a snapshot would store.
func decodeChange(rec []byte) (*change, error) {
	var c change
	if err := json.Unmarshal(rec, &c); err != nil {
		return nil, err
	}
	if c.Put != nil {
		if err := checkEntry(c.Put); err != nil {
			return nil, err
		}
	}
	if c.Drop < 0 {
		return nil, fmt.Errorf("drop %d", c.Drop)
	}
	return &c, nil
}

// parseSnapshot rebuilds a state from a snapshot file's bytes: a head, then
// entries and events (the events in rising seq), then an end whose counts
// match. Anything else, a torn frame included, is a corrupt snapshot.
func parseSnapshot(b []byte) (*state, uint64, error) {
	c, err := wal.Parse(b)
	if err != nil {
		return nil, 0, err
	}
	if c.Torn > 0 {
		return nil, 0, fmt.Errorf("snapshot: %d bytes that are not records at offset %d", c.Torn, c.End)
	}
	if len(c.Records) < 2 {
		return nil, 0, errors.New("snapshot: no head and end records")
	}
	s := newState("")
	for i, rec := range c.Records {
		ch, err := decodeChange(rec)
		if err != nil {
			return nil, 0, fmt.Errorf("snapshot record %d: %w", i, err)
		}
		first, last := i == 0, i == len(c.Records)-1
		switch {
		case first != (ch.Head != nil), last != (ch.End != nil):
			return nil, 0, fmt.Errorf("snapshot record %d: a head or end out of place", i)
		case first:
			if ch.Head.Node == "" || strings.ContainsAny(ch.Head.Node, "\x00\n") {
				return nil, 0, fmt.Errorf("snapshot head: node id %q", ch.Head.Node)
			}
			s.apply(&change{Head: ch.Head})
		case last:
			if ch.End.Entries != len(s.entries) || ch.End.Events != len(s.events) {
				return nil, 0, fmt.Errorf("snapshot end: %d entries and %d events, read %d and %d", ch.End.Entries, ch.End.Events, len(s.entries), len(s.events))
			}
		case ch.Put != nil && ch.Event == nil && len(ch.Del) == 0 && ch.Drop == 0 && ch.AckTo == 0:
			if s.entries[ch.Put.ID] != nil {
				return nil, 0, fmt.Errorf("snapshot record %d: entry %s twice", i, ch.Put.ID)
			}
			s.apply(ch)
		case ch.Event != nil && ch.Put == nil && len(ch.Del) == 0 && ch.Drop == 0 && ch.AckTo == 0:
			if ch.Event.Seq <= s.eventAck || ch.Event.Seq > s.eventSeq || (len(s.events) > 0 && ch.Event.Seq <= s.events[len(s.events)-1].Seq) {
				return nil, 0, fmt.Errorf("snapshot record %d: event %d out of order", i, ch.Event.Seq)
			}
			seq := s.eventSeq
			s.apply(ch)
			s.eventSeq = seq
		default:
			return nil, 0, fmt.Errorf("snapshot record %d: not one entry or one event", i)
		}
	}
	return s, c.Gen, nil
}
