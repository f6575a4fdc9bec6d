package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// writeLegacy writes a bbolt journal as the releases before the
// write-ahead log left it: its buckets, its meta keys, its index buckets,
// entries as JSON under their ids, events as JSON under big-endian seqs.
func writeLegacy(t *testing.T, path, node string, entries []*Entry, events []Event, seq, ack, dropped uint64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	be := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	err = db.Update(func(tx *bolt.Tx) error {
		bk := map[string]*bolt.Bucket{}
		for _, n := range []string{"meta", "commands", "events", "open", "unacked"} {
			b, err := tx.CreateBucket([]byte(n))
			if err != nil {
				return err
			}
			bk[n] = b
		}
		m := bk["meta"]
		for k, v := range map[string][]byte{"node_id": []byte(node), "event_seq": be(seq), "event_ack": be(ack),
			"events_dropped": be(dropped), "events_unacked": be(uint64(len(events))), "indexed": {1}} {
			if err := m.Put([]byte(k), v); err != nil {
				return err
			}
		}
		for _, e := range entries {
			b, _ := json.Marshal(e)
			if err := bk["commands"].Put([]byte(e.ID), b); err != nil {
				return err
			}
			if e.State != Done {
				bk["open"].Put([]byte(e.ID), []byte{1})
			} else if !e.Acked {
				bk["unacked"].Put([]byte(e.ID), []byte{1})
			}
		}
		for _, ev := range events {
			b, _ := json.Marshal(ev)
			if err := bk["events"].Put(be(ev.Seq), b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestImportLegacyJournal: a node that updates itself from a release with
// the bbolt journal keeps every entry in every state, its events, their
// acked seq and drop count; the old file is moved aside (never read again,
// so an entry is never run twice from it), and imported once.
func TestImportLegacyJournal(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	entries := []*Entry{
		{ID: "acc", Kind: "k", Lane: "control", Command: []byte("cmd-acc"), State: Accepted, AcceptedAt: at},
		{ID: "run", Kind: "side-effect", Lane: "bulk", Command: []byte("cmd-run"), State: Running, AcceptedAt: at.Add(time.Second), StartedAt: at.Add(2 * time.Second)},
		{ID: "done", Kind: "k", State: Done, Result: []byte("res-done"), AcceptedAt: at.Add(3 * time.Second), StartedAt: at.Add(4 * time.Second), FinishedAt: at.Add(5 * time.Second)},
		{ID: "acked", Kind: "k", State: Done, Result: []byte("res-acked"), Acked: true, AcceptedAt: at.Add(6 * time.Second), FinishedAt: at.Add(7 * time.Second), AckedAt: at.Add(8 * time.Second)},
	}
	events := []Event{{Seq: 5, Type: "a", Body: []byte("b5"), At: at}, {Seq: 6, Type: "b", At: at}, {Seq: 7, Type: "c", Body: []byte("b7"), At: at}}
	legacy := filepath.Join(dir, LegacyFile)
	writeLegacy(t, legacy, "n1", entries, events, 7, 4, 2)

	// Another node's journal is refused and left where it is.
	if _, _, err := Open(filepath.Join(dir, File), "n2"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("another node's bbolt journal: %v", err)
	}
	if _, err := os.Stat(legacy); err != nil {
		t.Fatalf("refused journal.db moved: %v", err)
	}

	j, op, err := Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	if op.Imported == "" || op.MovedAside != "" {
		t.Fatalf("opened %+v, want the import reported", op)
	}
	// journal.db is now a tombstone: the release before, started again
	// by a rolled-back update, refuses it rather than start empty.
	if err := previousReleaseOpens(legacy, "n1"); err == nil || !strings.Contains(err.Error(), "JOURNAL MOVED: the journal of n1 is now the directory journal/") {
		t.Fatalf("the release before opens journal.db after the import: %v", err)
	}
	if _, err := os.Stat(op.Imported); err != nil {
		t.Fatalf("imported file not kept aside: %v", err)
	}
	check := func(j *Journal) {
		t.Helper()
		for _, want := range entries {
			got, _ := j.Get(want.ID)
			wb, _ := json.Marshal(want)
			gb, _ := json.Marshal(got)
			if string(wb) != string(gb) {
				t.Errorf("entry %s:\n got %s\nwant %s", want.ID, gb, wb)
			}
		}
		evs, ack, _ := j.Events()
		eb, _ := json.Marshal(evs)
		wb, _ := json.Marshal(events)
		if string(eb) != string(wb) || ack != 4 || j.Dropped() != 2 {
			t.Errorf("events %s ack %d dropped %d; want %s, 4, 2", eb, ack, j.Dropped(), wb)
		}
		un, _ := j.Unacked()
		if len(un) != 1 || un[0].ID != "done" {
			t.Errorf("unacked %v, want done", un)
		}
	}
	check(j)
	if seq, err := j.AppendEvent("d", nil); err != nil || seq != 8 {
		t.Fatalf("next event seq %d %v, want 8", seq, err)
	}
	torun, err := j.Recover(func(string) bool { return false }, func(e *Entry) []byte { return []byte("INTERRUPTED") })
	if err != nil || len(torun) != 1 || torun[0].ID != "acc" {
		t.Fatalf("recover after import: %v %v", torun, err)
	}
	if r, _ := j.Get("run"); r.State != Done || string(r.Result) != "INTERRUPTED" {
		t.Fatalf("the running entry after recover: %+v", r)
	}
	j.Close()

	// A crash after the import's snapshot and before the tombstone leaves
	// journal.db in place: it is retired, not imported again (which would
	// bring back "run" as running).
	if err := os.Rename(op.Imported, legacy); err != nil {
		t.Fatal(err)
	}
	j, op2, err := Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if op2.Imported != "" {
		t.Fatalf("imported twice: %+v", op2)
	}
	if !isTombstone(legacy) {
		t.Fatal("journal.db is not a tombstone after the second open")
	}
	if r, _ := j.Get("run"); r.State != Done {
		t.Fatalf("the running entry came back from journal.db: %+v", r)
	}
	if evs, _, _ := j.Events(); len(evs) != 4 {
		t.Fatalf("%d events after reopen, want 4", len(evs))
	}
}

// previousReleaseOpens is what the release before the write-ahead log did
// with journal.db on Open: its buckets made, then its node id compared
// with the node's (it refused another node's journal, ErrOtherNode).
func previousReleaseOpens(path, node string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error {
		for _, n := range []string{"meta", "commands", "events", "open", "unacked"} {
			if _, err := tx.CreateBucketIfNotExists([]byte(n)); err != nil {
				return err
			}
		}
		m := tx.Bucket([]byte("meta"))
		if have := m.Get([]byte("node_id")); have != nil {
			if string(have) != node {
				return fmt.Errorf("%w (%s, not %s): move it aside with bcd join --reset --yes", ErrOtherNode, have, node)
			}
			return nil
		}
		return m.Put([]byte("node_id"), []byte(node))
	})
}

// TestTombstoneWithoutDirectory: a node reset (bcd join --reset moves the
// journal directory and journal.db aside) or a journal directory removed
// by hand beside a tombstone starts an empty journal, and a tombstone is
// never imported as a journal.
func TestTombstoneWithoutDirectory(t *testing.T) {
	dir := t.TempDir()
	legacy := filepath.Join(dir, LegacyFile)
	writeLegacy(t, legacy, "n1", []*Entry{{ID: "acc", Kind: "k", State: Accepted, AcceptedAt: time.Now().UTC()}}, nil, 0, 0, 0)
	j, _, err := Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := os.RemoveAll(filepath.Join(dir, File)); err != nil {
		t.Fatal(err)
	}
	j, op, err := Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatalf("open beside a tombstone: %v", err)
	}
	defer j.Close()
	if op.Imported != "" {
		t.Errorf("a tombstone was imported: %+v", op)
	}
	if es, _ := j.Entries(); len(es) != 0 {
		t.Errorf("entries %v from a tombstone", es)
	}
	if !isTombstone(legacy) {
		t.Error("the tombstone is gone")
	}
}

// TestImportAgainAfterRollback: an Open imported journal.db and ended
// before its tombstone (a crash; the tombstone is its last step, so
// nothing ran), then the update was rolled back and the release before
// ran on journal.db: it finished "acc" and accepted "new". The next Open
// imports journal.db again rather than go on from the first import's
// snapshot, which would run "acc" a second time and forget "new".
func TestImportAgainAfterRollback(t *testing.T) {
	dir := t.TempDir()
	legacy := filepath.Join(dir, LegacyFile)
	at := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	writeLegacy(t, legacy, "n1", []*Entry{{ID: "acc", Kind: "k", State: Accepted, AcceptedAt: at}}, nil, 0, 0, 0)
	j, op, err := Open(filepath.Join(dir, File), "n1")
	if err != nil || op.Imported == "" {
		t.Fatalf("first open: %+v %v", op, err)
	}
	j.Close()
	if err := os.Rename(op.Imported, legacy); err != nil { // no tombstone yet
		t.Fatal(err)
	}
	if err := os.Remove(legacy); err != nil { // the release before, running on it
		t.Fatal(err)
	}
	writeLegacy(t, legacy, "n1", []*Entry{
		{ID: "acc", Kind: "k", State: Done, Result: []byte("r"), AcceptedAt: at, StartedAt: at, FinishedAt: at},
		{ID: "new", Kind: "k", State: Accepted, AcceptedAt: at.Add(time.Second)},
	}, nil, 0, 0, 0)
	j, op, err = Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if op.Imported == "" {
		t.Errorf("journal.db changed since the import and was not imported again: %+v", op)
	}
	if e, _ := j.Get("acc"); e == nil || e.State != Done {
		t.Errorf("acc: %+v, want done as the release before left it", e)
	}
	if e, _ := j.Get("new"); e == nil {
		t.Error("new, accepted by the release before, is gone")
	}
	if !isTombstone(legacy) {
		t.Error("journal.db is not a tombstone")
	}
}
