package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
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
	for _, id := range []string{"x", "x2", "x3"} {
		if err := j.AckResult(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.AckResult("never-seen"); err != nil {
		t.Fatalf("ack of a swept id: %v", err)
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
	dir := t.TempDir()
	p := filepath.Join(dir, File)
	if err := os.WriteFile(p, []byte(strings.Repeat("garbage!", 4096)), 0o600); err != nil {
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
	if b, err := os.ReadFile(op.MovedAside); err != nil || !strings.HasPrefix(string(b), "garbage!") {
		t.Fatalf("moved-aside file: %v", err)
	}
	if _, isNew, err := j.Accept("c", "k", "", nil); err != nil || !isNew {
		t.Fatalf("fresh journal: %v", err)
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
	// As a journal from before the indexes: no index buckets, no marker.
	if err := j.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bOpen, bUnacked} {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bMeta).Delete(kIndexed)
	}); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	check(j)
}
