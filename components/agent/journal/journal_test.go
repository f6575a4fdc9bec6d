package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, dir, node string) *Journal {
	t.Helper()
	j, op, err := Open(filepath.Join(dir, File), node)
	if err != nil {
		t.Fatal(err)
	}
	if op.MovedAside != "" {
		t.Fatalf("unexpected move aside: %v", op)
	}
	return j
}

func TestAcceptOnceAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	e, isNew, err := j.Accept("c1", "k", "control", []byte("cmd"))
	if err != nil || !isNew || e.State != Accepted {
		t.Fatalf("first Accept: %v %v %+v", err, isNew, e)
	}
	if err := j.Start("c1"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start("c1"); err == nil {
		t.Fatal("a running command started again")
	}
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	e, isNew, err = j.Accept("c1", "k", "control", nil)
	if err != nil || isNew || e.State != Running {
		t.Fatalf("Accept after reopen: %v new=%v %+v", err, isNew, e)
	}
}

// TestAcceptStartedAndFinished: a command accepted and started, or
// accepted and refused, is one record and one fdatasync, kept across a
// reopen; an id seen before keeps its entry whichever way it comes again.
func TestAcceptStartedAndFinished(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	syncs := j.Stats().Syncs
	if e, isNew, err := j.AcceptStarted("s", "k", "control", []byte("cmd"), time.Time{}); err != nil || !isNew || e.State != Running || e.StartedAt.IsZero() {
		t.Fatalf("AcceptStarted: %v new=%v %+v", err, isNew, e)
	}
	if e, isNew, err := j.AcceptFinished("r", "k", "control", time.Time{}, []byte("refused")); err != nil || !isNew || e.State != Done {
		t.Fatalf("AcceptFinished: %v new=%v %+v", err, isNew, e)
	}
	if n := j.Stats().Syncs - syncs; n != 2 {
		t.Fatalf("two writes issued %d fsyncs, want 2", n)
	}
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	for _, again := range []func(id string) (*Entry, bool, error){
		func(id string) (*Entry, bool, error) { return j.Accept(id, "k", "control", nil) },
		func(id string) (*Entry, bool, error) { return j.AcceptStarted(id, "k", "control", nil, time.Time{}) },
		func(id string) (*Entry, bool, error) {
			return j.AcceptFinished(id, "k", "control", time.Time{}, []byte("other"))
		},
	} {
		if e, isNew, err := again("s"); err != nil || isNew || e.State != Running {
			t.Fatalf("s again: %v new=%v %+v", err, isNew, e)
		}
		if e, isNew, err := again("r"); err != nil || isNew || e.State != Done || string(e.Result) != "refused" {
			t.Fatalf("r again: %v new=%v %+v", err, isNew, e)
		}
	}
	if open, _ := j.Entries(Running); len(open) != 1 {
		t.Fatalf("running entries after reopen: %v", open)
	}
	if un, _ := j.Unacked(); len(un) != 1 || un[0].ID != "r" {
		t.Fatalf("unacked after reopen: %v", un)
	}
}

func TestRecover(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	for _, id := range []string{"a-run", "b-idem", "c-acc", "d-done"} {
		kind := "side-effect"
		if id == "b-idem" {
			kind = "idempotent"
		}
		if _, _, err := j.Accept(id, kind, "control", nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	for _, id := range []string{"a-run", "b-idem", "d-done"} {
		if err := j.Start(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Finish("d-done", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	j.Close()

	j = open(t, dir, "n1")
	defer j.Close()
	torun, err := j.Recover(func(k string) bool { return k == "idempotent" }, func(e *Entry) []byte { return []byte("INTERRUPTED " + e.ID) })
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range torun {
		ids = append(ids, e.ID)
	}
	if strings.Join(ids, ",") != "b-idem,c-acc" {
		t.Fatalf("to run: %v, want b-idem,c-acc", ids)
	}
	a, _ := j.Get("a-run")
	if a.State != Done || string(a.Result) != "INTERRUPTED a-run" {
		t.Fatalf("a-run after recover: %+v", a)
	}
	un, _ := j.Unacked()
	if len(un) != 2 {
		t.Fatalf("unacked: %d, want 2 (a-run interrupted, d-done)", len(un))
	}
	// Finish keeps the first result.
	if err := j.Finish("d-done", []byte("second")); err != nil {
		t.Fatal(err)
	}
	d, _ := j.Get("d-done")
	if string(d.Result) != "ok" {
		t.Fatalf("d-done result %q", d.Result)
	}
}

func TestAckAndSweep(t *testing.T) {
	j := open(t, t.TempDir(), "n1")
	defer j.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	for _, id := range []string{"x", "x2", "x3", "y"} {
		j.Accept(id, "k", "", nil)
		j.Start(id)
		j.Finish(id, []byte("r"))
	}
	// An ack is written, not fdatasynced: the next commit's fdatasync
	// covers it.
	syncs := j.Stats().Syncs
	for _, id := range []string{"x", "x2", "x3"} {
		j.AckResult(id)
	}
	j.AckResult("never-seen") // swept already: nothing to do
	if n := j.Stats().Syncs - syncs; n != 0 {
		t.Fatalf("three acks issued %d fsyncs, want 0", n)
	}
	if un, _ := j.Unacked(); len(un) != 1 || un[0].ID != "y" {
		t.Fatalf("unacked after the acks: %v, want y alone", un)
	}
	now = now.Add(2 * time.Hour)
	n, err := j.Sweep(time.Hour)
	if err != nil || n != 3 {
		t.Fatalf("Sweep = %d, %v; want 3", n, err)
	}
	if e, _ := j.Get("x"); e != nil {
		t.Fatal("acked entry not swept")
	}
	if e, _ := j.Get("y"); e == nil {
		t.Fatal("unacked entry swept")
	}
}

func TestOtherNodeRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, "n1").Close()
	_, _, err := Open(filepath.Join(dir, File), "n2")
	if !errors.Is(err, ErrOtherNode) || !strings.Contains(err.Error(), "bcd join --reset --yes") {
		t.Fatalf("err = %v", err)
	}
}

func TestCorruptMovedAside(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(dir, p string) error // damage the journal at p
		file  string                    // the damaged file, under the moved-aside path
	}{
		{"snapshot", func(dir, p string) error {
			return os.WriteFile(filepath.Join(p, snapName), []byte(strings.Repeat("garbage!", 4096)), 0o600)
		}, snapName},
		{"snapshot torn", func(dir, p string) error {
			b, err := os.ReadFile(filepath.Join(p, snapName))
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, snapName), b[:len(b)-3], 0o600)
		}, snapName},
		{"a file in the journal's place", func(dir, p string) error {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			return os.WriteFile(p, []byte(strings.Repeat("garbage!", 4096)), 0o600)
		}, ""},
		{"bbolt journal.db", func(dir, p string) error {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, LegacyFile), []byte(strings.Repeat("garbage!", 4096)), 0o600)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, File)
			j := open(t, dir, "n1")
			if _, _, err := j.Accept("old", "k", "", nil); err != nil {
				t.Fatal(err)
			}
			j.Close()
			if err := tc.write(dir, p); err != nil {
				t.Fatal(err)
			}
			j, op, err := Open(p, "n1")
			if err != nil {
				t.Fatal(err)
			}
			defer j.Close()
			if op.MovedAside == "" || op.Reason == nil {
				t.Fatalf("corrupt file not reported: %+v", op)
			}
			b, err := os.ReadFile(filepath.Join(op.MovedAside, tc.file))
			if err != nil || (len(b) == 0) {
				t.Fatalf("moved-aside file: %v", err)
			}
			if _, isNew, err := j.Accept("c", "k", "", nil); err != nil || !isNew {
				t.Fatalf("fresh journal: %v", err)
			}
		})
	}
}

// TestTornLogTailCut: a log whose last write was torn (a crash in the
// middle of a write) is read up to the last whole record, silently (the
// journal is not moved aside); the torn bytes are reported and never read.
func TestTornLogTailCut(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	for _, id := range []string{"a", "b", "c"} {
		if _, _, err := j.Accept(id, "k", "", []byte("cmd")); err != nil {
			t.Fatal(err)
		}
	}
	lp := j.log.Path()
	size := j.log.Size()
	j.Close()
	f, err := os.OpenFile(lp, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Half of c's record is lost, and garbage follows.
	if _, err := f.WriteAt([]byte("\x01\x02torn write"), size-20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	j, op, err := Open(filepath.Join(dir, File), "n1")
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if op.MovedAside != "" || op.TornTail == 0 || op.Replayed != 2 {
		t.Fatalf("opened %+v; want the torn tail reported, 2 records replayed, nothing moved aside", op)
	}
	if a, _ := j.Get("a"); a == nil {
		t.Fatal("a whole record before the torn one was lost")
	}
	if c, _ := j.Get("c"); c != nil {
		t.Fatalf("the torn record was read: %+v", c)
	}
	if _, isNew, err := j.Accept("c", "k", "", nil); err != nil || !isNew {
		t.Fatalf("accept after the cut: new=%v %v", isNew, err)
	}
}

func TestEventsCapAndAck(t *testing.T) {
	j := open(t, t.TempDir(), "n1")
	defer j.Close()
	j.maxEvents = 5
	for i := 0; i < 8; i++ {
		if _, err := j.AppendEvent("t", nil); err != nil {
			t.Fatal(err)
		}
	}
	evs, _, _ := j.Events()
	if len(evs) != 5 || evs[0].Seq != 4 || j.Dropped() != 3 {
		t.Fatalf("events %d first %d dropped %d; want 5, 4, 3", len(evs), evs[0].Seq, j.Dropped())
	}
	if err := j.AckEvents(6); err != nil {
		t.Fatal(err)
	}
	evs, acked, _ := j.Events()
	if len(evs) != 2 || acked != 6 {
		t.Fatalf("after ack: %d events, acked %d", len(evs), acked)
	}
}

// TestIndexes: after accepts, starts, results, acks and a sweep, the open
// and unacked indexes give what a full scan gives; a journal written
// before the indexes is indexed when opened.
func TestIndexes(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, "n1")
	for i := 0; i < 40; i++ {
		id := fmt.Sprintf("c%02d", i)
		if _, _, err := j.Accept(id, "k", "control", nil); err != nil {
			t.Fatal(err)
		}
		if i%4 >= 1 {
			j.Start(id)
		}
		if i%4 >= 2 {
			j.Finish(id, []byte("r"))
		}
		if i%4 == 3 {
			j.AckResult(id)
		}
	}
	j.now = func() time.Time { return time.Now().Add(48 * time.Hour) }
	if n, err := j.Sweep(time.Hour); err != nil || n != 10 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	check := func(j *Journal) {
		t.Helper()
		all, err := j.Entries()
		if err != nil {
			t.Fatal(err)
		}
		var open, unacked []string
		for _, e := range all {
			if e.State == Accepted || e.State == Running {
				open = append(open, e.ID)
			}
			if e.State == Done && !e.Acked {
				unacked = append(unacked, e.ID)
			}
		}
		ids := func(es []*Entry, err error) []string {
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, e := range es {
				out = append(out, e.ID)
			}
			return out
		}
		if got := ids(j.Entries(Accepted, Running)); fmt.Sprint(got) != fmt.Sprint(open) || len(open) != 20 {
			t.Errorf("open: index %v, scan %v", got, open)
		}
		if got := ids(j.Unacked()); fmt.Sprint(got) != fmt.Sprint(unacked) || len(unacked) != 10 {
			t.Errorf("unacked: index %v, scan %v", got, unacked)
		}
	}
	check(j)
	// The same after a reopen, from the snapshot and the log replayed.
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	check(j)
}

// TestOversizedWriteFailsAlone: a write larger than a log record holds
// fails alone; the rest of its group and the journal go on.
func TestOversizedWriteFailsAlone(t *testing.T) {
	j := open(t, t.TempDir(), "n1")
	defer j.Close()
	if _, _, err := j.Accept("big", "k", "", make([]byte, 7<<20)); err == nil {
		t.Fatal("a 7 MiB command (over 8 MiB as JSON) was accepted")
	}
	if _, isNew, err := j.Accept("small", "k", "", nil); err != nil || !isNew {
		t.Fatalf("accept after the oversized write: %v", err)
	}
	if e, _ := j.Get("big"); e != nil {
		t.Fatal("the oversized write is in the journal")
	}
}

// TestSweepKeepsUntilDeadline: an acked entry is swept only once both its
// acked ttl and its deadline have passed.
func TestSweepKeepsUntilDeadline(t *testing.T) {
	j := open(t, t.TempDir(), "n1")
	defer j.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	for id, dl := range map[string]time.Time{"week": now.Add(7 * 24 * time.Hour), "none": {}, "soon": now.Add(time.Minute)} {
		if _, _, err := j.AcceptUntil(id, "k", "", []byte("c"), dl); err != nil {
			t.Fatal(err)
		}
		j.Start(id)
		j.Finish(id, []byte("r"))
		j.AckResult(id)
	}
	now = now.Add(25 * time.Hour)
	if n, err := j.Sweep(24 * time.Hour); err != nil || n != 2 {
		t.Fatalf("Sweep after 25h = %d, %v; want 2 (none, soon)", n, err)
	}
	if e, _ := j.Get("week"); e == nil || !e.Deadline.Equal(time.Date(2026, 1, 8, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("the entry with a deadline a week out: %+v", e)
	}
	now = now.Add(6 * 24 * time.Hour)
	if n, err := j.Sweep(24 * time.Hour); err != nil || n != 1 {
		t.Fatalf("Sweep past the deadline = %d, %v; want 1", n, err)
	}
}
