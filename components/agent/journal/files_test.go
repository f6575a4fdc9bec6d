package journal

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal/wal"
)

// dump is a journal's state as its readers see it.
func dump(t *testing.T, j *Journal) string {
	t.Helper()
	all, err := j.Entries()
	if err != nil {
		t.Fatal(err)
	}
	evs, ack, _ := j.Events()
	b, _ := json.Marshal(struct {
		E  []*Entry
		V  []Event
		A  uint64
		D  uint64
		Un []*Entry
	}{all, evs, ack, j.Dropped(), must(j.Unacked())})
	return string(b)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// smallLogs makes the log's bound 16 KiB for the test, so a few hundred
// writes compact it.
func smallLogs(t *testing.T) {
	old := compactAt
	compactAt = 16 << 10
	t.Cleanup(func() { compactAt = old })
}

// TestCompaction: a log past its bound is written as a new snapshot and a
// new log started, the old log removed; the state is the same before and
// after, and after a reopen.
func TestCompaction(t *testing.T) {
	smallLogs(t)
	dir := t.TempDir()
	j := open(t, dir, "n1")
	gen0 := j.gen
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j.now = func() time.Time { return now }
	for i := 0; i < 600; i++ {
		id := fmt.Sprintf("c%03d", i)
		if _, _, err := j.Accept(id, "k", "control", bytes.Repeat([]byte("x"), 100)); err != nil {
			t.Fatal(err)
		}
		if i%3 > 0 {
			j.Start(id)
			j.Finish(id, []byte("result"))
		}
		if i%3 == 2 {
			j.AckResult(id)
		}
		if _, err := j.AppendEvent("e", []byte(id)); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			j.AckEvents(uint64(i / 2))
		}
		if i%100 == 99 {
			now = now.Add(time.Hour)
			if _, err := j.Sweep(30 * time.Minute); err != nil {
				t.Fatal(err)
			}
		}
	}
	if j.gen < gen0+5 {
		t.Fatalf("generation %d after %d: the log was not compacted", j.gen, gen0)
	}
	ents, _ := os.ReadDir(j.dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{lockName, logName(j.gen), snapName}; !slices.Equal(names, want) {
		t.Fatalf("files %v, want %v", names, want)
	}
	if j.log.Size() > 2*compactAt+wal.Segment {
		t.Fatalf("log of %d bytes", j.log.Size())
	}
	before := dump(t, j)
	j.Close()
	j = open(t, dir, "n1")
	defer j.Close()
	if after := dump(t, j); after != before {
		t.Fatalf("state changed across the reopen:\n%s\n%s", before, after)
	}
}

// FuzzSnapshot: any bytes given as a snapshot either fail with an error
// or give a state whose own snapshot reads back the same.
func FuzzSnapshot(f *testing.F) {
	s := newState("n1")
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.apply(&change{Put: &Entry{ID: "a", Kind: "k", State: Accepted, Command: []byte("c"), AcceptedAt: at}})
	s.apply(&change{Put: &Entry{ID: "b", Kind: "k", State: Done, Result: []byte("r"), AcceptedAt: at}})
	s.apply(&change{Event: &Event{Seq: 1, Type: "t", At: at}})
	s.apply(&change{Event: &Event{Seq: 2, Type: "t", At: at}})
	s.apply(&change{AckTo: 1})
	frame := func(s *state, gen uint64) []byte {
		recs, err := s.snapshotRecords()
		if err != nil {
			panic(err)
		}
		b := wal.AppendHeader(nil, gen)
		for _, r := range recs {
			b = wal.AppendFrame(b, gen, r)
		}
		return b
	}
	good := frame(s, 3)
	f.Add(good)
	f.Add(good[:len(good)-5])
	f.Add(frame(newState("n2"), 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, gen, err := parseSnapshot(b)
		if err != nil {
			return
		}
		again := frame(st, gen)
		st2, _, err := parseSnapshot(again)
		if err != nil {
			t.Fatalf("a state's own snapshot does not read: %v", err)
		}
		if !bytes.Equal(frame(st2, gen), again) {
			t.Fatal("a snapshot read back differs")
		}
	})
}
