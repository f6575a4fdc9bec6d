package journal

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// Group commit. Every write of the journal is a function of one bbolt
// transaction handed to a single writer goroutine. The writer takes the
// first waiting write, then every other write already queued (up to
// maxGroup), runs them in one transaction and commits it: bbolt fsyncs the
// pages, then the meta page. Only after that commit returns does any
// caller in the group get its answer, so the journal's rules hold as they
// did with one transaction per write: nothing runs before its acceptance
// is durable, and no result is acked before it is durable. Writes that
// arrive while a commit is being fsynced wait for the next one and share
// it; a write that arrives alone is committed at once (no timer).
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
	done  chan error
	errOf error // fn's error in the last run
}

type writer struct {
	db   *bolt.DB
	mu   sync.RWMutex // held to send on in; stop takes it to close in
	shut bool
	in   chan *write
	gone chan struct{}

	writes, commits atomic.Uint64

	// beforeCommit, when set (tests), runs after a group's functions and
	// before its commit: the place a crash loses the whole group. An error
	// stands for a failed commit (an fsync's EIO): the group is rolled
	// back and every write in it gets the error.
	beforeCommit func(n int) error
}

func startWriter(db *bolt.DB) *writer {
	w := &writer{db: db, in: make(chan *write, maxGroup), gone: make(chan struct{})}
	go w.loop()
	return w
}

// do hands fn to the writer and returns once the transaction holding it is
// committed (fsynced), or with fn's error, or the commit's.
func (w *writer) do(fn func(*bolt.Tx) error) error {
	wr := &write{fn: fn, done: make(chan error, 1)}
	w.mu.RLock()
	if w.shut {
		w.mu.RUnlock()
		return ErrClosed
	}
	w.in <- wr
	w.mu.RUnlock()
	return <-wr.done
}

// stop lets the queued writes commit and ends the writer.
func (w *writer) stop() {
	w.mu.Lock()
	if !w.shut {
		w.shut = true
		close(w.in)
	}
	w.mu.Unlock()
	<-w.gone
}

func (w *writer) loop() {
	defer close(w.gone)
	group := make([]*write, 0, maxGroup)
	for first := range w.in {
		group = append(group[:0], first)
		// Let the callers the last commit just answered queue their next
		// writes, so they join this group rather than the one after.
		runtime.Gosched()
	more:
		for len(group) < maxGroup {
			select {
			case wr, ok := <-w.in:
				if !ok {
					break more
				}
				group = append(group, wr)
			default:
				break more
			}
		}
		w.commit(group)
	}
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
