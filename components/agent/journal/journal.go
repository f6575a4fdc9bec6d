// Package journal is the agent's durable record of every command it
// accepted and every event it raised. It is what makes delivery
// exactly-once: a command id is recorded before anything runs, marked
// running before its side effect, and its result is kept and re-sent until
// the gateway acks it. docs/delivery.md states the rules.
//
// The journal is a directory: a snapshot of its state and a write-ahead
// log (package wal) of every write since, both replayed into memory on
// Open. A write is one log record; writes are committed in groups
// (commit.go): the writes that arrive while a group is being fdatasynced
// share the next group and its one fdatasync, and no write returns to its
// caller before the group holding it is on disk. Readers see only what is
// on disk. When the log has grown past its bound, the state is written as
// a new snapshot and a new log started (files.go).
package journal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// File is the journal's name under the data directory (a directory).
// LegacyFile is the bbolt file of the releases before it, imported once by
// Open and moved aside.
const (
	File       = "journal"
	LegacyFile = "journal.db"
)

// Limits.
const (
	MaxBytes          = 64 << 20 // the state (what a snapshot holds) may not grow past this
	MaxUnackedEvents  = 10000    // the oldest unacked event is dropped beyond this
	DefaultAckedTTL   = 24 * time.Hour
	maxStoredResultSz = 1 << 20
)

// States of a command entry.
const (
	Accepted = "accepted" // recorded, not started: safe to run
	Running  = "running"  // its side effect may have begun
	Done     = "done"     // a result is stored
)

// Errors callers distinguish.
var (
	ErrOtherNode = errors.New("journal belongs to another node")
	ErrFull      = errors.New("journal is full (64 MiB); results waiting for acks fill it")
	ErrUnknown   = errors.New("no such command in the journal")
)

// Entry is one command as the journal holds it.
type Entry struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`
	Lane       string    `json:"lane,omitempty"`
	Command    []byte    `json:"command,omitempty"` // the marshalled command, to run it after a restart
	State      string    `json:"state"`
	Result     []byte    `json:"result,omitempty"` // the marshalled result
	Acked      bool      `json:"acked,omitempty"`
	AcceptedAt time.Time `json:"accepted_at"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	AckedAt    time.Time `json:"acked_at,omitzero"`
	// Deadline is the command's own (zero: none). An acked entry is kept
	// until it has passed, so a command redelivered before then is still
	// known and not run twice.
	Deadline time.Time `json:"deadline,omitzero"`
}

// Event is an event waiting for the gateway's ack.
type Event struct {
	Seq  uint64    `json:"seq"`
	Type string    `json:"type"`
	Body []byte    `json:"body,omitempty"`
	At   time.Time `json:"at"`
}

// Journal is safe for concurrent use; its writes are committed in groups
// (commit.go).
type Journal struct {
	files
	now       func() time.Time
	maxEvents int
	mu        sync.RWMutex // guards st
	st        *state       // what is on disk: what readers see
	w         *writer
}

// Opened reports what Open found.
type Opened struct {
	// MovedAside names the corrupt file or directory Open renamed, when it
	// had to, and Reason says why.
	MovedAside string
	Reason     error
	// Imported names where the previous release's bbolt journal went
	// after Open imported it.
	Imported string
	// Replayed counts the log records replayed after the snapshot.
	Replayed int
	// TornTail counts the bytes of a write torn by a crash that ended the
	// log; they were cut (a crash does this; nothing acked is in them).
	TornTail int64
}

// Open opens the journal at path (a directory) for nodeID, creating it if
// need be, from the bbolt journal of the previous release when there is
// one beside it. A snapshot or log that cannot be read is moved aside
// with its directory (path.corrupt-UNIX) and a new journal started;
// Opened says so. A journal of another node is refused with ErrOtherNode.
func Open(path, nodeID string) (*Journal, Opened, error) {
	j := &Journal{now: time.Now, maxEvents: MaxUnackedEvents}
	st, op, err := j.files.open(path, nodeID)
	if err != nil {
		return nil, op, fmt.Errorf("journal %s: %w", path, err)
	}
	j.st = st
	j.w = startWriter(j, st.clone())
	return j, op, nil
}

// Close lets the writes already handed to the writer commit, then closes
// the files; writes after Close fail with ErrClosed.
func (j *Journal) Close() error {
	j.w.stop()
	return j.files.close()
}

// Path is the journal's directory.
func (j *Journal) Path() string { return j.dir }

// Accept records a command before anything runs. It returns the entry and
// whether it is new; an id seen before returns the stored entry and false,
// whatever its state, so a command is never accepted twice.
func (j *Journal) Accept(id, kind, lane string, command []byte) (*Entry, bool, error) {
	return j.AcceptUntil(id, kind, lane, command, time.Time{})
}

// AcceptUntil is Accept for a command with a deadline (zero: none): its
// entry outlives the deadline, whatever Sweep's ttl (docs/delivery.md).
func (j *Journal) AcceptUntil(id, kind, lane string, command []byte, deadline time.Time) (*Entry, bool, error) {
	return j.accept(&Entry{ID: id, Kind: kind, Lane: lane, Command: command, State: Accepted, Deadline: deadline})
}

// AcceptStarted is AcceptUntil for a command that runs at once: accepted
// and marked running in one record, so its one fdatasync does for both
// (docs/delivery.md). Call it only once the command has a worker and its
// resources: a crash from here on reports it interrupted, never runs it.
func (j *Journal) AcceptStarted(id, kind, lane string, command []byte, deadline time.Time) (*Entry, bool, error) {
	return j.accept(&Entry{ID: id, Kind: kind, Lane: lane, Command: command, State: Running, Deadline: deadline})
}

// AcceptFinished is AcceptUntil for a command refused before anything ran:
// accepted with its result, in one record. An id seen before keeps its
// entry and its result.
func (j *Journal) AcceptFinished(id, kind, lane string, deadline time.Time, result []byte) (*Entry, bool, error) {
	if len(result) > maxStoredResultSz {
		return nil, false, fmt.Errorf("result of %s is %d bytes, more than the journal keeps", id, len(result))
	}
	return j.accept(&Entry{ID: id, Kind: kind, Lane: lane, Result: result, State: Done, Deadline: deadline})
}

// accept stores e, a new entry, unless its id is known.
func (j *Journal) accept(n *Entry) (*Entry, bool, error) {
	var out *Entry
	isNew := false
	err := j.w.do(func(h *state) (*change, error) {
		if e := h.entries[n.ID]; e != nil {
			out = readCopy(e)
			return nil, nil
		}
		if h.bytes > MaxBytes {
			return nil, ErrFull
		}
		e := readCopy(n)
		e.AcceptedAt = j.now().UTC()
		switch e.State {
		case Running:
			e.StartedAt = e.AcceptedAt
		case Done:
			e.FinishedAt = e.AcceptedAt
		}
		if !e.Deadline.IsZero() {
			e.Deadline = e.Deadline.UTC()
		}
		out, isNew = readCopy(e), true
		return &change{Put: e}, nil
	})
	return out, isNew, err
}

// Start marks a command running; call it before the side effect begins.
func (j *Journal) Start(id string) error {
	return j.update(id, func(e *Entry) error {
		if e.State != Accepted {
			return fmt.Errorf("command %s is %s, not accepted", id, e.State)
		}
		e.State, e.StartedAt = Running, j.now().UTC()
		return nil
	})
}

// Finish stores a command's result. A command already done keeps its first
// result.
func (j *Journal) Finish(id string, result []byte) error {
	if len(result) > maxStoredResultSz {
		return fmt.Errorf("result of %s is %d bytes, more than the journal keeps", id, len(result))
	}
	return j.update(id, func(e *Entry) error {
		if e.State == Done {
			return errNoChange
		}
		e.State, e.Result, e.FinishedAt, e.Command = Done, bytes.Clone(result), j.now().UTC(), nil
		return nil
	})
}

// AckResult records that the gateway stored a command's result. The
// record is not fdatasynced (docs/delivery.md): it is written to the log
// at once, or by the commit under way, and is made durable by the next
// commit's fdatasync. An ack lost to a power cut only has the result sent
// again, which the gateway stores once and acks again. So AckResult does
// not wait and reports no error of its commit.
func (j *Journal) AckResult(id string) {
	j.w.lazy(func(h *state) (*change, error) {
		e := h.entries[id]
		if e == nil || e.State != Done || e.Acked {
			return nil, nil // swept already, or acked
		}
		n := copyEntry(e)
		n.Acked, n.AckedAt = true, j.now().UTC()
		return &change{Put: n}, nil
	})
}

// errNoChange tells update the entry stays as it is (and the write succeeds).
var errNoChange = errors.New("no change")

func (j *Journal) update(id string, f func(*Entry) error) error {
	return j.w.do(func(h *state) (*change, error) {
		e := h.entries[id]
		if e == nil {
			return nil, fmt.Errorf("%w: %s", ErrUnknown, id)
		}
		n := copyEntry(e)
		if err := f(n); err != nil {
			if errors.Is(err, errNoChange) {
				return nil, nil
			}
			return nil, err
		}
		return &change{Put: n}, nil
	})
}

// copyEntry copies an entry for a write to change (the state's entries
// are never changed in place; a write replaces its byte slices whole).
func copyEntry(e *Entry) *Entry { c := *e; return &c }

// readCopy copies an entry for a caller, who may change it.
func readCopy(e *Entry) *Entry {
	c := *e
	c.Command, c.Result = bytes.Clone(e.Command), bytes.Clone(e.Result)
	return &c
}

// Get returns one entry, or nil.
func (j *Journal) Get(id string) (*Entry, error) {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if e := j.st.entries[id]; e != nil {
		return readCopy(e), nil
	}
	return nil, nil
}

// Entries returns every entry in the given states (all when none given),
// oldest accepted first. Accepted and running entries are found through
// the open index.
func (j *Journal) Entries(states ...string) ([]*Entry, error) {
	want := map[string]bool{}
	for _, s := range states {
		want[s] = true
	}
	open := len(want) > 0
	for s := range want {
		open = open && (s == Accepted || s == Running)
	}
	var out []*Entry
	j.mu.RLock()
	if open {
		for id := range j.st.open {
			if e := j.st.entries[id]; want[e.State] {
				out = append(out, readCopy(e))
			}
		}
	} else {
		for _, e := range j.st.entries {
			if len(want) == 0 || want[e.State] {
				out = append(out, readCopy(e))
			}
		}
	}
	j.mu.RUnlock()
	sortEntries(out)
	return out, nil
}

func sortEntries(es []*Entry) {
	slices.SortFunc(es, func(a, b *Entry) int {
		if c := a.AcceptedAt.Compare(b.AcceptedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// Unacked returns the done entries whose results the gateway has not
// acked, oldest accepted first, through the unacked index.
func (j *Journal) Unacked() ([]*Entry, error) {
	var out []*Entry
	j.mu.RLock()
	for id := range j.st.unacked {
		out = append(out, readCopy(j.st.entries[id]))
	}
	j.mu.RUnlock()
	sortEntries(out)
	return out, nil
}

// Recover settles what a previous process left: a running command is
// finished by interrupted(e) (its result), unless idempotent(kind) says
// it may run again, in which case it goes back to accepted. It returns
// the entries to run (accepted ones, oldest first).
func (j *Journal) Recover(idempotent func(kind string) bool, interrupted func(*Entry) []byte) ([]*Entry, error) {
	running, err := j.Entries(Running)
	if err != nil {
		return nil, err
	}
	for _, e := range running {
		if idempotent != nil && idempotent(e.Kind) {
			err = j.update(e.ID, func(x *Entry) error { x.State, x.StartedAt = Accepted, time.Time{}; return nil })
		} else {
			err = j.Finish(e.ID, interrupted(e))
		}
		if err != nil {
			return nil, err
		}
	}
	return j.Entries(Accepted)
}

// Sweep deletes acked entries acked more than ttl ago whose deadline, if
// they have one, has passed, and returns how many. A spent command id is
// so remembered as long as the command could still be delivered: one
// delivered again after it was forgotten is refused for its deadline.
func (j *Journal) Sweep(ttl time.Duration) (int, error) {
	now := j.now()
	cut := now.Add(-ttl)
	n := 0
	err := j.w.do(func(h *state) (*change, error) {
		var del []string
		for id, e := range h.entries {
			if e.Acked && e.AckedAt.Before(cut) && (e.Deadline.IsZero() || now.After(e.Deadline)) {
				del = append(del, id)
			}
		}
		n = len(del)
		if n == 0 {
			return nil, nil
		}
		slices.Sort(del)
		return &change{Del: del}, nil
	})
	return n, err
}

// AppendEvent stores an event and returns its sequence number. Beyond
// MaxUnackedEvents the oldest unacked event is dropped and counted.
func (j *Journal) AppendEvent(typ string, body []byte) (uint64, error) {
	var seq uint64
	err := j.w.do(func(h *state) (*change, error) {
		seq = h.eventSeq + 1
		return &change{
			Event: &Event{Seq: seq, Type: typ, Body: bytes.Clone(body), At: j.now().UTC()},
			Drop:  max(0, len(h.events)+1-j.maxEvents),
		}, nil
	})
	return seq, err
}

// AckEvents drops every event up to and including seq.
func (j *Journal) AckEvents(seq uint64) error {
	return j.w.do(func(h *state) (*change, error) {
		if seq <= h.eventAck {
			return nil, nil
		}
		return &change{AckTo: seq}, nil
	})
}

// Events returns the unacked events, oldest first, and the last acked seq.
func (j *Journal) Events() ([]Event, uint64, error) {
	j.mu.RLock()
	defer j.mu.RUnlock()
	out := slices.Clone(j.st.events)
	for i := range out {
		out[i].Body = bytes.Clone(out[i].Body)
	}
	return out, j.st.eventAck, nil
}

// Dropped is how many unacked events the cap has dropped.
func (j *Journal) Dropped() uint64 {
	j.mu.RLock()
	defer j.mu.RUnlock()
	return j.st.dropped
}

// nodeCheck refuses a journal of another node.
func nodeCheck(have, want string) error {
	if have != want {
		return fmt.Errorf("%w (%s, not %s): move it aside with bcd join --reset --yes", ErrOtherNode, have, want)
	}
	return nil
}

func moveAside(path, why string) (string, error) {
	aside := fmt.Sprintf("%s.%s-%d", path, why, time.Now().Unix())
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, nil
}
