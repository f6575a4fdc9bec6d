package journal

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every write of the journal is a function of one bbolt
// transaction. A write that finds no commit under way commits itself, in
// its caller's goroutine, with every write queued by then (no handoff, no
// timer: a write alone goes at once; after a shared commit it first yields
// once, so the callers that commit answered can join it). Writes that
// arrive while a commit is being fsynced queue; when it ends, the first of
// them is woken to commit the whole queue (up to maxGroup) in one
// transaction. bbolt fsyncs the
// pages, then the meta page, and only after that commit returns does any
// caller in the group get its answer, so the journal's rules hold as they
// did with one transaction per write: nothing runs before its acceptance
// is durable, and no result is acked before it is durable.
//
// A write whose function fails must leave nothing behind, but it may
// already have changed the shared transaction. So a group with a failed
// write is rolled back whole and each of its writes is then committed
// alone, in order; the functions are run again and must set their
// outputs afresh on each run.

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("journal is closed")

// maxGroup bounds one commit: its transaction and the time the writes in
// it wait.
const maxGroup = 256

// Stats counts the writer's work since Open.
type Stats struct {
	Writes  uint64 // write functions committed or failed
	Commits uint64 // bbolt commits (each is two fdatasyncs: pages, then meta)
}

// Stats returns the writer's counts.
func (j *Journal) Stats() Stats {
	return Stats{Writes: j.w.writes.Load(), Commits: j.w.commits.Load()}
}

type write struct {
	fn    func(*bolt.Tx) error
	done  chan error    // its answer, once its group is committed
	lead  chan struct{} // woken to commit the queue
	errOf error         // fn's error in the last run
}

type writer struct {
	db    *bolt.DB
	mu    sync.Mutex
	idle  *sync.Cond // signalled when busy turns false
	busy  bool       // a commit is under way
	shut  bool
	queue []*write
	// lastGroup is how many writes the last commit held; more than one
	// means writes are arriving together.
	lastGroup int

	writes, commits atomic.Uint64

	// beforeCommit, when set (tests), runs after a group's functions and
	// before its commit: the place a crash loses the whole group. An error
	// stands for a failed commit (an fsync's EIO): the group is rolled
	// back and every write in it gets the error.
	beforeCommit func(n int) error
}

func startWriter(db *bolt.DB) *writer {
	w := &writer{db: db}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// do runs fn in a committed transaction and returns once that transaction
// is on disk (fsynced), or with fn's error, or the commit's.
func (w *writer) do(fn func(*bolt.Tx) error) error {
	wr := &write{fn: fn, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	w.mu.Lock()
	if w.shut {
		w.mu.Unlock()
		return ErrClosed
	}
	w.queue = append(w.queue, wr)
	if !w.busy && w.lastGroup > 1 {
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
				// Ours is committed: hand the queue to its first write's
				// caller rather than keep this caller waiting.
				w.queue[0].lead <- struct{}{}
				w.mu.Unlock()
				return err
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

// errInGroup marks a group rolled back because one of its writes failed.
var errInGroup = errors.New("a write in the group failed")

func (w *writer) commit(group []*write) {
	w.writes.Add(uint64(len(group)))
	if len(group) > 1 {
		err := w.run(group)
		if !errors.Is(err, errInGroup) {
			for _, wr := range group {
				wr.done <- err
			}
			return
		}
	}
	// One write alone, or a group with a failed write: each in its own
	// transaction.
	for _, wr := range group {
		err := w.run([]*write{wr})
		if errors.Is(err, errInGroup) {
			err = wr.errOf
		}
		wr.done <- err
	}
}

// run runs the group's functions in one transaction and commits it. A
// failed function rolls it back and returns errInGroup (the function's own
// error is kept on its write).
func (w *writer) run(group []*write) error {
	tx, err := w.db.Begin(true)
	if err != nil {
		return err
	}
	for _, wr := range group {
		if wr.errOf = wr.fn(tx); wr.errOf != nil {
			_ = tx.Rollback()
			return errInGroup
		}
	}
	if w.beforeCommit != nil {
		if err := w.beforeCommit(len(group)); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	w.commits.Add(1)
	return tx.Commit()
}
