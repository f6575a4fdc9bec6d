package journal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/agent/journal/wal"
	"github.com/better-compute/bcd/components/base/filehash"
)

// The journal's directory holds:
//
//	snapshot    the state as of the start of the log (wal frames: a head,
//	            every entry, every event, an end that counts them)
//	log.GEN     the writes since, GEN being the snapshot's generation
//	lock        flock'd while a process has the journal open
//
// A new generation (rotate) creates log.GEN+1, writes the snapshot to
// snapshot.tmp, fsyncs it, renames it over snapshot and fsyncs the
// directory; only then is log.GEN removed. A crash anywhere leaves either
// the old snapshot with its whole log, or the new one with its empty log:
// Open reads the snapshot's generation and only the log of that generation.
const (
	snapName  = "snapshot"
	lockName  = "lock"
	logPrefix = "log."
)

// compactAt is how large the log may grow (and at least as large as the
// last snapshot) before the state is written as a new snapshot: the files
// stay under twice the state (at most MaxBytes) plus this. A variable for
// tests.
var compactAt int64 = 8 << 20

// createLog and syncDir are wal's, swapped by tests to fail a rotation.
var (
	createLog = wal.Create
	syncDir   = wal.SyncDir
)

func logName(gen uint64) string { return logPrefix + strconv.FormatUint(gen, 10) }

// files is the journal's directory and the log open in it. Only Open,
// Close and the writer (one commit at a time) use it.
type files struct {
	dir       string
	lock      *os.File
	log       *wal.Log
	gen       uint64
	snapBytes int64
	// rotSyncs counts the fsyncs of rotations (the log's own are counted
	// by each log).
	rotSyncs, logSyncs uint64
}

// errCorrupt marks a snapshot or log that cannot be read.
type errCorrupt struct{ err error }

func (e errCorrupt) Error() string { return "corrupt journal: " + e.err.Error() }
func (e errCorrupt) Unwrap() error { return e.err }

func (f *files) open(path, nodeID string) (*state, Opened, error) {
	var op Opened
	f.dir = path
	if st, err := os.Lstat(path); err == nil && !st.IsDir() {
		// Not a journal of this release: move it aside like a corrupt one.
		aside, rerr := moveAside(path, "corrupt")
		if rerr != nil {
			return nil, op, fmt.Errorf("%s is not a directory; moving it aside: %w", path, rerr)
		}
		op.MovedAside, op.Reason = aside, errors.New("not a journal directory")
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		// A new journal's directory entry is made durable before anything
		// in it is counted on.
		if err := os.MkdirAll(path, 0o700); err != nil {
			return nil, op, err
		}
		if err := syncDir(filepath.Dir(path)); err != nil {
			return nil, op, err
		}
	}
	if err := f.lockDir(); err != nil {
		return nil, op, err
	}
	legacy := filepath.Join(filepath.Dir(path), LegacyFile)
	// Read once: whether a journal.db that is no tombstone is beside the
	// directory (to import, or to retire after a crash).
	live := legacyLive(legacy)
	st, imported, err := f.load(nodeID, legacy, live, &op)
	var corrupt errCorrupt
	if errors.As(err, &corrupt) {
		f.unlock()
		aside, rerr := moveAside(path, "corrupt")
		if rerr != nil {
			return nil, op, fmt.Errorf("%w; and moving it aside: %v", err, rerr)
		}
		op = Opened{MovedAside: aside, Reason: err}
		if err := os.MkdirAll(path, 0o700); err != nil {
			return nil, op, err
		}
		if err := f.lockDir(); err != nil {
			return nil, op, err
		}
		st, imported, err = newState(nodeID), false, nil
		f.gen = 0
		if live {
			st, imported, err = f.importFrom(legacy, nodeID, st, &op)
		}
	}
	if err != nil {
		f.unlock()
		return nil, op, err
	}
	// Always start a new generation: the log read ends where it ends, and
	// whatever a torn write left after that is never appended to.
	if err := f.rotate(st); err != nil {
		f.unlock()
		return nil, op, err
	}
	f.removeStale()
	if _, err := os.Lstat(legacy); err == nil && live {
		// Imported now, or before a crash that came before its tombstone
		// (tombstone.go): a rolled-back update must not find it missing.
		aside, err := retireLegacy(legacy, st.node)
		if err != nil {
			f.close()
			return nil, op, err
		}
		if imported {
			op.Imported = aside
		}
	}
	return st, op, nil
}

// legacyLive reports whether a bbolt journal.db that is not a tombstone
// is at legacy.
func legacyLive(legacy string) bool {
	_, err := os.Lstat(legacy)
	return err == nil && !isTombstone(legacy)
}

// load reads the snapshot and replays its log; with no snapshot, it
// imports the legacy bbolt journal (live), or starts an empty one.
func (f *files) load(nodeID, legacy string, live bool, op *Opened) (st *state, imported bool, err error) {
	b, err := os.ReadFile(filepath.Join(f.dir, snapName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		f.gen = 0
		if !live {
			// No journal yet, or only the tombstone of one imported before
			// whose directory is gone (moved aside, or removed by hand).
			return newState(nodeID), false, nil
		}
		return f.importFrom(legacy, nodeID, newState(nodeID), op)
	case err != nil:
		return nil, false, err
	}
	st, err = f.replay(b, nodeID, op)
	if err != nil {
		return nil, false, err
	}
	if live {
		// journal.db is still there, beside a snapshot: an Open that
		// imported it ended before its tombstone (the last step, so nothing
		// ran on what it imported). If the release before has run on it
		// since (a rollback in between), it is not the file imported, and
		// it is the truth: import it again. Otherwise open() retires it.
		if sum, err := filehash.SHA256(legacy); err != nil || sum != st.importedFrom {
			f.gen = 0
			return f.importFrom(legacy, nodeID, st, op)
		}
	}
	return st, false, nil
}

// importFrom imports the legacy journal. A corrupt one is moved aside, as
// a corrupt bbolt journal always was, and the journal goes on from
// otherwise (empty, or what it held).
func (f *files) importFrom(legacy, nodeID string, otherwise *state, op *Opened) (*state, bool, error) {
	st, err := importLegacy(legacy, nodeID)
	var corrupt errCorrupt
	if errors.As(err, &corrupt) {
		aside, rerr := moveAside(legacy, "corrupt")
		if rerr != nil {
			return nil, false, fmt.Errorf("%w; and moving it aside: %v", err, rerr)
		}
		op.MovedAside, op.Reason = aside, err
		return otherwise, false, nil
	}
	return st, err == nil, err
}

// replay reads a snapshot and replays its log.
func (f *files) replay(b []byte, nodeID string, op *Opened) (*state, error) {
	st, gen, err := parseSnapshot(b)
	if err != nil {
		return nil, errCorrupt{fmt.Errorf("%s: %w", snapName, err)}
	}
	if err := nodeCheck(st.node, nodeID); err != nil {
		return nil, err
	}
	f.gen, f.snapBytes = gen, int64(len(b))
	c, err := wal.ReadFile(filepath.Join(f.dir, logName(gen)))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil // a rotation ended before its log was written to
	}
	if err != nil {
		return nil, errCorrupt{err}
	}
	if c.Gen != gen {
		return nil, errCorrupt{fmt.Errorf("%s holds generation %d", logName(gen), c.Gen)}
	}
	for i, rec := range c.Records {
		ch, err := decodeChange(rec)
		if err == nil && (ch.Head != nil || ch.End != nil) {
			err = errors.New("a snapshot record in the log")
		}
		if err != nil {
			return nil, errCorrupt{fmt.Errorf("%s record %d: %w", logName(gen), i, err)}
		}
		st.apply(ch)
	}
	op.Replayed, op.TornTail = len(c.Records), c.Torn
	return st, nil
}

// rotate starts generation gen+1: a new log, and s written as its
// snapshot. The old log is removed once the snapshot is durable.
func (f *files) rotate(s *state) error {
	gen := f.gen + 1
	lp := filepath.Join(f.dir, logName(gen))
	_ = os.Remove(lp) // a rotation that crashed before its snapshot left it
	l, err := createLog(lp, gen, wal.Segment)
	if err != nil {
		return fmt.Errorf("new log: %w", err)
	}
	n, renamed, err := writeSnapshot(f.dir, gen, s)
	f.rotSyncs += 2 // the snapshot, the directory (the new log counts its own)
	if err != nil {
		l.Close()
		os.Remove(lp)
		if renamed && f.log != nil {
			// The new snapshot is in place but may not be durable: a restart
			// reads either it (and no log, removing the old one) or the old
			// snapshot and log. Nothing more may go to the old log, or the
			// first case loses it: the next commit tries the rotation again.
			f.log.Fail(fmt.Errorf("journal: a new snapshot's directory could not be synced: %w", err))
		}
		return err
	}
	old := f.log
	f.log, f.gen, f.snapBytes = l, gen, n
	if old != nil {
		f.logSyncs += old.Syncs()
		old.Close()
		os.Remove(old.Path())
	}
	return nil
}

// writeSnapshot writes s as the snapshot of generation gen: to a temporary
// file, fsynced, renamed over the snapshot, the directory fsynced. renamed
// says the new snapshot took the old one's place, even when the directory's
// fsync then failed.
func writeSnapshot(dir string, gen uint64, s *state) (size int64, renamed bool, err error) {
	recs, err := s.snapshotRecords()
	if err != nil {
		return 0, false, err
	}
	tmp := filepath.Join(dir, snapName+".tmp")
	_ = os.Remove(tmp)
	l, err := wal.Create(tmp, gen, 0)
	if err != nil {
		return 0, false, fmt.Errorf("snapshot: %w", err)
	}
	defer l.Close()
	for len(recs) > 0 {
		n := min(len(recs), 4096)
		if err := l.Append(recs[:n]); err != nil {
			return 0, false, fmt.Errorf("snapshot: %w", err)
		}
		recs = recs[n:]
	}
	if err := l.Sync(); err != nil {
		return 0, false, fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, snapName)); err != nil {
		return 0, false, fmt.Errorf("snapshot: %w", err)
	}
	return l.Size(), true, syncDir(dir)
}

// removeStale removes logs of other generations and a snapshot.tmp: what
// rotations that crashed left.
func (f *files) removeStale() {
	ents, _ := os.ReadDir(f.dir)
	for _, e := range ents {
		n := e.Name()
		if n == snapName+".tmp" || (strings.HasPrefix(n, logPrefix) && n != logName(f.gen)) {
			_ = os.Remove(filepath.Join(f.dir, n))
		}
	}
}

func (f *files) syncs() uint64 {
	n := f.rotSyncs + f.logSyncs
	if f.log != nil {
		n += f.log.Syncs()
	}
	return n
}

// lockDir takes the journal's lock, waiting up to 2 s for another process
// to let go of it.
func (f *files) lockDir() error {
	lf, err := os.OpenFile(filepath.Join(f.dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Second); ; {
		err = syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			f.lock = lf
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			lf.Close()
			return fmt.Errorf("flock(%s) = %w (is another bcd running on this data directory?)", lf.Name(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *files) unlock() {
	if f.lock != nil {
		f.lock.Close()
		f.lock = nil
	}
}

func (f *files) close() error {
	var err error
	if f.log != nil {
		err = f.log.Close()
	}
	f.unlock()
	return err
}
