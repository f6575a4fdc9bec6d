package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/better-compute/bcd/components/agent/journal/wal"
)

// Group commit. Every write of the journal is a function that reads the
// journal's state as of the writes before it and returns its change (one
// log record). A write that finds no commit under way commits itself, in
// its caller's goroutine, with every write queued by then (no handoff, no
// timer: a write alone goes at once; after a shared commit it first yields
// once, so the callers that commit answered can join it). Writes that
// arrive while a commit is being fdatasynced queue; when it ends, the
// first of them is woken to commit the whole queue (up to maxGroup).
//
// A commit runs the group's functions in order against the writer's head
// state (the state on disk plus the group's earlier changes), appends
// their records to the log in one write, and fdatasyncs it once. Only then
// are the changes applied to the state readers see, and only then does
// any caller in the group get its answer: nothing runs before its
// acceptance is durable, no result is acked before it is durable.
//
// A write whose function fails changes nothing and gets its error; the
// rest of its group commits without it. A commit whose write or fdatasync
// fails fails every write in it: the head goes back to the state on disk,
// and the journal starts a new generation from that state (files.go), so
// the failed group's records, whatever of them reached the disk, are never
// read. If that fails too, every write fails until a commit manages to
// start one (each failed commit tries again).

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("journal is closed")

// maxGroup bounds one commit: its log write and the time the writes in it
// wait.
const maxGroup = 256

// Stats counts the writer's work since Open.
type Stats struct {
	Writes  uint64 // write functions committed or failed
	Commits uint64 // groups written to the log with one fdatasync (a group of lazy writes only has none)
	Syncs   uint64 // every fsync and fdatasync: the commits', the log's segments' and new generations' (snapshots)
}

// Stats returns the writer's counts.
func (j *Journal) Stats() Stats {
	j.w.mu.Lock()
	syncs := j.w.syncs
	j.w.mu.Unlock()
	return Stats{Writes: j.w.writes.Load(), Commits: j.w.commits.Load(), Syncs: syncs}
}

type write struct {
	fn   func(*state) (*change, error)
	done chan error    // its answer, once its group is committed
	lead chan struct{} // woken to commit the queue
	// lazy writes (result acks) are not waited for and need no
	// fdatasync of their own: a group of lazy writes only is written to
	// the log and not synced; the next commit's fdatasync covers it.
	lazy bool
}

type writer struct {
	j     *Journal
	head  *state // the state on disk plus the changes of the group being committed
	mu    sync.Mutex
	idle  *sync.Cond // signalled when busy turns false
	busy  bool       // a commit is under way
	shut  bool
	queue []*write
	// lastGroup is how many writes the last commit held; more than one
	// means writes are arriving together.
	lastGroup int
	recs      [][]byte
	changes   []*change
	errs      []error
	syncs     uint64 // files.syncs() after the last commit, for Stats

	writes, commits atomic.Uint64

	// beforeCommit, when set (tests), runs after a group's records are
	// written to the log and before its fdatasync: the place a crash or a
	// power cut loses the group. An error stands for a failed fdatasync
	// (EIO): every write in the group gets it.
	beforeCommit func(n int) error
}

func startWriter(j *Journal, head *state) *writer {
	w := &writer{j: j, head: head, syncs: j.syncs()}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// do runs fn as one write and returns once its change is on disk
// (fdatasynced), or with fn's error, or the commit's.
func (w *writer) do(fn func(*state) (*change, error)) error {
	return w.run(&write{fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)})
}

// lazy runs fn as a lazy write: committed by this caller when no commit is
// under way (a write(2), no fdatasync), else queued for the commit under
// way, and not waited for.
func (w *writer) lazy(fn func(*state) (*change, error)) {
	_ = w.run(&write{fn: fn, done: make(chan error, 1), lazy: true})
}

func (w *writer) run(wr *write) error {
	w.mu.Lock()
	if w.shut {
		w.mu.Unlock()
		return ErrClosed
	}
	w.queue = append(w.queue, wr)
	if wr.lazy && w.busy {
		w.mu.Unlock()
		return nil // the commit under way takes it
	}
	if !w.busy && w.lastGroup > 1 && !wr.lazy {
		// The last commit was shared: its other callers are about to
		// write again. Let them queue, so this commit is shared too,
		// rather than go alone and leave them to the next.
		w.busy = true
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	} else if w.busy {
		w.mu.Unlock()
		select {
		case err := <-wr.done: // committed in another caller's group
			return err
		case <-wr.lead: // the last commit ended with this write first in the queue
		}
		// Writes are arriving together: let the callers the last commit
		// just answered queue their next writes, so they join this group
		// rather than the one after.
		runtime.Gosched()
		w.mu.Lock()
	}
	w.busy = true
	for len(w.queue) > 0 {
		n := min(len(w.queue), maxGroup)
		group := w.queue[:n:n]
		w.queue = w.queue[n:]
		w.lastGroup = n
		w.mu.Unlock()
		w.commit(group)
		w.mu.Lock()
		if len(w.queue) > 0 {
			select {
			case err := <-wr.done:
				// Ours is committed: hand the queue to the first caller
				// waiting in it rather than keep this caller waiting (a
				// queue of lazy writes only is cheap: this caller
				// commits it).
				if i := slices.IndexFunc(w.queue, func(q *write) bool { return !q.lazy }); i >= 0 {
					w.queue[i].lead <- struct{}{}
					w.mu.Unlock()
					return err
				}
				wr.done <- err
			default:
			}
		}
	}
	w.busy = false
	w.idle.Broadcast()
	w.mu.Unlock()
	return <-wr.done
}

// stop refuses new writes and waits for the commit under way, and the
// queue, to finish.
func (w *writer) stop() {
	w.mu.Lock()
	w.shut = true
	for w.busy {
		w.idle.Wait()
	}
	w.mu.Unlock()
}

func (w *writer) commit(group []*write) {
	w.writes.Add(uint64(len(group)))
	w.recs, w.changes, w.errs = w.recs[:0], w.changes[:0], w.errs[:0]
	sync := false
	for _, wr := range group {
		c, err := wr.fn(w.head)
		if err == nil && c != nil {
			var rec []byte
			if rec, err = json.Marshal(c); err == nil && len(rec) > wal.MaxRecord {
				err = fmt.Errorf("a write of %d bytes, more than a journal record holds (%d)", len(rec), wal.MaxRecord)
			}
			if err == nil {
				w.head.apply(c)
				w.recs = append(w.recs, rec)
				w.changes = append(w.changes, c)
				sync = sync || !wr.lazy
			}
		}
		w.errs = append(w.errs, err)
	}
	// A group that changed nothing read only what is on disk: no record,
	// no fdatasync.
	if len(w.recs) > 0 {
		if err := w.flush(len(group), sync); err != nil {
			for i := range w.errs {
				w.errs[i] = err
			}
		}
	}
	for i, wr := range group {
		wr.done <- w.errs[i]
	}
	// The log has grown past its bound: the state becomes the snapshot of a
	// new generation. The group is answered already; the next waits. A
	// failure leaves the current log in use, and the next commit tries again.
	if size := w.j.log.Size(); size > compactAt && size > w.j.snapBytes {
		_ = w.j.rotate(w.j.st)
	}
	w.mu.Lock()
	w.syncs = w.j.syncs()
	w.mu.Unlock()
}

// flush writes the group's records and, unless it holds lazy writes
// only, fdatasyncs them, then applies the changes to the state readers
// see. A failure resets the head and starts a new generation from the
// state on disk.
func (w *writer) flush(n int, sync bool) error {
	j := w.j
	err := j.log.Append(w.recs)
	if sync {
		if err == nil && w.beforeCommit != nil {
			err = w.beforeCommit(n)
		}
		if err == nil {
			err = j.log.Sync()
		}
	}
	if err != nil {
		j.log.Fail(err)
		w.head = j.st.clone()
		// The group's frames must not be read again, by this process or the
		// next: zeroed here, and gone with the log when a new generation
		// starts from the state on disk.
		derr := j.log.Discard()
		if rerr := j.rotate(j.st); rerr != nil {
			if derr != nil {
				return fmt.Errorf("%w (and neither discarding the group: %v, nor starting a new log: %v; the log takes no writes until a later commit starts one)", err, derr, rerr)
			}
			return fmt.Errorf("%w (and starting a new log: %v; the log takes no writes until a later commit starts one)", err, rerr)
		}
		return err
	}
	if sync {
		w.commits.Add(1)
	}
	j.mu.Lock()
	for _, c := range w.changes {
		j.st.apply(c)
	}
	j.mu.Unlock()
	return nil
}
