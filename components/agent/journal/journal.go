// Package journal is the agent's durable record of every command it
// accepted and every event it raised, in one bbolt file fsynced on each
// write. It is what makes delivery exactly-once: a command id is recorded
// before anything runs, marked running before its side effect, and its
// result is kept and re-sent until the gateway acks it. docs/delivery.md
// states the rules.
//
// Writes are committed in groups (group commit, commit.go): writes that
// arrive while a commit is being fsynced share the next commit and its
// fsyncs, and no write returns to its caller before the commit holding it
// is on disk.
package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

// File is the journal's name under the data directory.
const File = "journal.db"

// Limits.
const (
	MaxBytes          = 64 << 20 // the file may not grow past this
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

var (
	bMeta     = []byte("meta")
	bCommands = []byte("commands")
	bEvents   = []byte("events")
	kNodeID   = []byte("node_id")
	kEventSeq = []byte("event_seq")
	kEventAck = []byte("event_ack")
	kDropped  = []byte("events_dropped")
	kEventN   = []byte("events_unacked")
	// The indexes: ids of the entries accepted or running (what a restart
	// runs or settles), and of the results not acked (what goes out after
	// each Welcome), so a restart does not decode every entry kept for a
	// day. kIndexed marks them built (a journal from before them is
	// indexed once on Open).
	bOpen    = []byte("open")
	bUnacked = []byte("unacked")
	kIndexed = []byte("indexed")
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
	db        *bolt.DB
	path      string
	now       func() time.Time
	maxEvents int
	w         *writer
}

// Opened reports what Open found.
type Opened struct {
	// MovedAside names the corrupt file Open renamed, when it had to.
	MovedAside string
	Reason     error
}

// Open opens the journal at path for nodeID. A file bbolt cannot read is
// moved aside (path.corrupt-UNIX) and a new journal started; Opened says
// so. A journal of another node is refused with ErrOtherNode.
func Open(path, nodeID string) (*Journal, Opened, error) {
	var op Opened
	db, err := openDB(path)
	if err != nil && !isLockTimeout(err) {
		if _, serr := os.Stat(path); serr == nil {
			aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().Unix())
			if rerr := os.Rename(path, aside); rerr != nil {
				return nil, op, fmt.Errorf("open %s: %w; and moving it aside: %v", path, err, rerr)
			}
			op = Opened{MovedAside: aside, Reason: err}
			db, err = openDB(path)
		}
	}
	if err != nil {
		return nil, op, fmt.Errorf("open %s: %w", path, err)
	}
	j := &Journal{db: db, path: path, now: time.Now, maxEvents: MaxUnackedEvents}
	// Set up before the writer starts, in a transaction of its own.
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bMeta, bCommands, bEvents, bOpen, bUnacked} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		m := tx.Bucket(bMeta)
		if m.Get(kIndexed) == nil {
			if err := buildIndexes(tx); err != nil {
				return err
			}
		}
		if have := m.Get(kNodeID); have != nil {
			if string(have) != nodeID {
				return fmt.Errorf("%w (%s, not %s): move it aside with bcd join --reset --yes", ErrOtherNode, have, nodeID)
			}
			return nil
		}
		return m.Put(kNodeID, []byte(nodeID))
	})
	if err != nil {
		db.Close()
		return nil, op, fmt.Errorf("journal %s: %w", path, err)
	}
	j.w = startWriter(db)
	return j, op, nil
}

func openDB(path string) (db *bolt.DB, err error) {
	// bbolt panics on some corrupt files instead of returning an error.
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("corrupt journal: %v", r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true})
	if err != nil {
		return nil, err
	}
	// A quick check that the pages are readable.
	if cerr := db.View(func(tx *bolt.Tx) error {
		for range tx.Check() {
			return errors.New("corrupt journal: bbolt check failed")
		}
		return nil
	}); cerr != nil {
		db.Close()
		return nil, cerr
	}
	return db, nil
}

func isLockTimeout(err error) bool { return errors.Is(err, bolt.ErrTimeout) }

// Close lets the writes already handed to the writer commit, then closes
// the file; writes after Close fail with ErrClosed.
func (j *Journal) Close() error {
	j.w.stop()
	return j.db.Close()
}

// Path is the journal's file.
func (j *Journal) Path() string { return j.path }

func (j *Journal) full() bool {
	st, err := os.Stat(j.path)
	return err == nil && st.Size() > MaxBytes
}

func getEntry(tx *bolt.Tx, id string) (*Entry, error) {
	b := tx.Bucket(bCommands).Get([]byte(id))
	if b == nil {
		return nil, nil
	}
	var e Entry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("journal entry %s: %w", id, err)
	}
	return &e, nil
}

func putEntry(tx *bolt.Tx, e *Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	if err := tx.Bucket(bCommands).Put([]byte(e.ID), b); err != nil {
		return err
	}
	return index(tx, e)
}

// index keeps e's id in the open and unacked indexes as its state says.
func index(tx *bolt.Tx, e *Entry) error {
	id := []byte(e.ID)
	for _, ix := range []struct {
		bucket []byte
		in     bool
	}{
		{bOpen, e.State == Accepted || e.State == Running},
		{bUnacked, e.State == Done && !e.Acked},
	} {
		b := tx.Bucket(ix.bucket)
		var err error
		if ix.in {
			err = b.Put(id, []byte{1})
		} else if b.Get(id) != nil {
			err = b.Delete(id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// buildIndexes indexes every entry, once, for a journal written before
// the indexes.
func buildIndexes(tx *bolt.Tx) error {
	err := tx.Bucket(bCommands).ForEach(func(k, v []byte) error {
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("journal entry %s: %w", k, err)
		}
		e.ID = string(k)
		return index(tx, &e)
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bMeta).Put(kIndexed, []byte{1})
}

// Accept records a command before anything runs. It returns the entry and
// whether it is new; an id seen before returns the stored entry and false,
// whatever its state, so a command is never accepted twice.
func (j *Journal) Accept(id, kind, lane string, command []byte) (*Entry, bool, error) {
	var out *Entry
	isNew := false
	err := j.w.do(func(tx *bolt.Tx) error {
		out, isNew = nil, false // the writer may run this more than once (commit.go)
		e, err := getEntry(tx, id)
		if err != nil || e != nil {
			out = e
			return err
		}
		if j.full() {
			return ErrFull
		}
		out = &Entry{ID: id, Kind: kind, Lane: lane, Command: command, State: Accepted, AcceptedAt: j.now().UTC()}
		isNew = true
		return putEntry(tx, out)
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
			return nil
		}
		e.State, e.Result, e.FinishedAt, e.Command = Done, result, j.now().UTC(), nil
		return nil
	})
}

// AckResult records that the gateway stored a command's result.
func (j *Journal) AckResult(id string) error {
	err := j.update(id, func(e *Entry) error {
		if e.State == Done && !e.Acked {
			e.Acked, e.AckedAt = true, j.now().UTC()
		}
		return nil
	})
	if errors.Is(err, ErrUnknown) {
		return nil // swept already
	}
	return err
}

func (j *Journal) update(id string, f func(*Entry) error) error {
	return j.w.do(func(tx *bolt.Tx) error {
		e, err := getEntry(tx, id)
		if err != nil {
			return err
		}
		if e == nil {
			return fmt.Errorf("%w: %s", ErrUnknown, id)
		}
		if err := f(e); err != nil {
			return err
		}
		return putEntry(tx, e)
	})
}

// Get returns one entry, or nil.
func (j *Journal) Get(id string) (*Entry, error) {
	var e *Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		var err error
		e, err = getEntry(tx, id)
		return err
	})
	return e, err
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
	err := j.db.View(func(tx *bolt.Tx) error {
		if open {
			return collect(tx, bOpen, func(e *Entry) bool { return want[e.State] }, &out)
		}
		return tx.Bucket(bCommands).ForEach(func(k, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("journal entry %s: %w", k, err)
			}
			if len(want) == 0 || want[e.State] {
				out = append(out, &e)
			}
			return nil
		})
	})
	sort.Slice(out, func(a, b int) bool { return out[a].AcceptedAt.Before(out[b].AcceptedAt) })
	return out, err
}

// collect appends the entries an index names that keep says to keep.
func collect(tx *bolt.Tx, index []byte, keep func(*Entry) bool, out *[]*Entry) error {
	return tx.Bucket(index).ForEach(func(k, _ []byte) error {
		e, err := getEntry(tx, string(k))
		if err != nil || e == nil {
			return err
		}
		if keep(e) {
			*out = append(*out, e)
		}
		return nil
	})
}

// Unacked returns the done entries whose results the gateway has not
// acked, oldest accepted first, through the unacked index.
func (j *Journal) Unacked() ([]*Entry, error) {
	var out []*Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		return collect(tx, bUnacked, func(e *Entry) bool { return e.State == Done && !e.Acked }, &out)
	})
	sort.Slice(out, func(a, b int) bool { return out[a].AcceptedAt.Before(out[b].AcceptedAt) })
	return out, err
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

// Sweep deletes acked entries acked more than ttl ago and returns how many.
func (j *Journal) Sweep(ttl time.Duration) (int, error) {
	cut := j.now().Add(-ttl)
	n := 0
	err := j.w.do(func(tx *bolt.Tx) error {
		b := tx.Bucket(bCommands)
		var del [][]byte
		_ = b.ForEach(func(k, v []byte) error {
			var e Entry
			if json.Unmarshal(v, &e) == nil && e.Acked && e.AckedAt.Before(cut) {
				del = append(del, append([]byte(nil), k...))
			}
			return nil
		})
		for _, k := range del {
			if err := b.Delete(k); err != nil {
				return err
			}
			// An acked entry is in neither index; this keeps it so.
			if err := index(tx, &Entry{ID: string(k)}); err != nil {
				return err
			}
		}
		n = len(del)
		return nil
	})
	return n, err
}

func u64(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func be(n uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, n)
	return b
}

// AppendEvent stores an event and returns its sequence number. Beyond
// MaxUnackedEvents the oldest unacked event is dropped and counted.
func (j *Journal) AppendEvent(typ string, body []byte) (uint64, error) {
	var seq uint64
	err := j.w.do(func(tx *bolt.Tx) error {
		m, ev := tx.Bucket(bMeta), tx.Bucket(bEvents)
		seq = u64(m.Get(kEventSeq)) + 1
		if err := m.Put(kEventSeq, be(seq)); err != nil {
			return err
		}
		b, err := json.Marshal(Event{Seq: seq, Type: typ, Body: body, At: j.now().UTC()})
		if err != nil {
			return err
		}
		if err := ev.Put(be(seq), b); err != nil {
			return err
		}
		n := u64(m.Get(kEventN)) + 1
		for ; n > uint64(j.maxEvents); n-- {
			k, _ := ev.Cursor().First()
			if k == nil {
				break
			}
			if err := ev.Delete(k); err != nil {
				return err
			}
			if err := m.Put(kDropped, be(u64(m.Get(kDropped))+1)); err != nil {
				return err
			}
		}
		return m.Put(kEventN, be(n))
	})
	return seq, err
}

// AckEvents drops every event up to and including seq.
func (j *Journal) AckEvents(seq uint64) error {
	return j.w.do(func(tx *bolt.Tx) error {
		m, ev := tx.Bucket(bMeta), tx.Bucket(bEvents)
		if seq <= u64(m.Get(kEventAck)) {
			return nil
		}
		if err := m.Put(kEventAck, be(seq)); err != nil {
			return err
		}
		n := u64(m.Get(kEventN))
		c := ev.Cursor()
		for k, _ := c.First(); k != nil && u64(k) <= seq; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n--
		}
		return m.Put(kEventN, be(n))
	})
}

// Events returns the unacked events, oldest first, and the last acked seq.
func (j *Journal) Events() ([]Event, uint64, error) {
	var out []Event
	var acked uint64
	err := j.db.View(func(tx *bolt.Tx) error {
		acked = u64(tx.Bucket(bMeta).Get(kEventAck))
		return tx.Bucket(bEvents).ForEach(func(k, v []byte) error {
			var e Event
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	return out, acked, err
}

// Dropped is how many unacked events the cap has dropped.
func (j *Journal) Dropped() uint64 {
	var n uint64
	_ = j.db.View(func(tx *bolt.Tx) error { n = u64(tx.Bucket(bMeta).Get(kDropped)); return nil })
	return n
}
