package journal

import (
	"fmt"
	"math/rand"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal/wal"
	"github.com/better-compute/bcd/components/agent/journal/wal/powercut"
)

// TestAckedWritesSurvivePowerCut runs the journal's logs on files that
// lose at a power cut whatever was not fdatasynced, writes from 8
// goroutines and cuts the power at a random moment: every write that
// returned is in the journal opened again from what reached the disk.
// Unlike TestAckedWritesSurviveCrash it does not take the log's word for
// what was synced, so a log that counts bytes as synced without its
// fdatasync fails it.
func TestAckedWritesSurvivePowerCut(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for trial := 0; trial < 6; trial++ {
		dir := t.TempDir()
		var mu sync.Mutex
		var logs []*powercut.File
		off := false
		createLog = func(p string, gen uint64, seg int64) (*wal.Log, error) {
			mu.Lock()
			defer mu.Unlock()
			if off {
				return nil, powercut.ErrPowerCut
			}
			f, err := powercut.Create(p)
			if err != nil {
				return nil, err
			}
			logs = append(logs, f)
			return wal.CreateOn(f, p, gen, seg)
		}
		t.Cleanup(func() { createLog = wal.Create })
		j := open(t, dir, "cut")
		acked := map[string]string{}
		var wg sync.WaitGroup
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					id := fmt.Sprintf("w%d-%d", w, i)
					accept := j.Accept
					if i%2 == 1 {
						accept = func(id, kind, lane string, c []byte) (*Entry, bool, error) {
							return j.AcceptStarted(id, kind, lane, c, time.Time{})
						}
					}
					if _, _, err := accept(id, "k", "", []byte("body")); err != nil {
						return
					}
					mu.Lock()
					acked[id] = Accepted
					mu.Unlock()
					if err := j.Finish(id, []byte("result")); err != nil {
						return
					}
					mu.Lock()
					acked[id] = Done
					mu.Unlock()
					// Not waited for and not synced by itself: it shares the
					// groups of the other writers' synced writes, which must
					// still be fdatasynced.
					j.AckResult(id)
				}
			}()
		}
		time.Sleep(time.Duration(5+rng.Intn(40)) * time.Millisecond)
		mu.Lock()
		for _, f := range logs {
			f.Cut()
		}
		off = true
		mu.Unlock()
		wg.Wait()
		j.Close()
		createLog = wal.Create
		if len(acked) == 0 {
			t.Fatalf("trial %d: nothing was acked before the power cut", trial)
		}
		j2, op, err := Open(filepath.Join(dir, File), "cut")
		if err != nil || op.MovedAside != "" {
			t.Fatalf("trial %d: no result is acked before it is durable: after a power cut the journal does not open (%v, moved aside %q), yet %d writes were acked",
				trial, err, op.MovedAside, len(acked))
		}
		lost := 0
		for id, want := range acked {
			e, err := j2.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if e == nil || want == Done && e.State != Done {
				lost++
			}
		}
		j2.Close()
		if lost > 0 {
			t.Fatalf("trial %d: no result is acked before it is durable: %d of %d acked writes are gone after a power cut", trial, lost, len(acked))
		}
	}
}

// TestLazyAckNeverSkipsSync: a group holding an ack (a lazy write, not
// fdatasynced by itself) and a result behind it is still fdatasynced
// before the result's caller is answered. The group is built for it: a
// commit is held in its fdatasync while a Finish and then an ack queue
// behind it, so they share the next group, the ack last; then the power
// is cut and the journal opened again from what reached the disk.
func TestLazyAckNeverSkipsSync(t *testing.T) {
	dir := t.TempDir()
	var logs []*powercut.File
	createLog = func(p string, gen uint64, seg int64) (*wal.Log, error) {
		f, err := powercut.Create(p)
		if err != nil {
			return nil, err
		}
		logs = append(logs, f)
		return wal.CreateOn(f, p, gen, seg)
	}
	t.Cleanup(func() { createLog = wal.Create })
	j := open(t, dir, "cut")
	for _, id := range []string{"acked", "held", "result"} {
		if _, _, err := j.Accept(id, "k", "", []byte("body")); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Finish("acked", []byte("r")); err != nil {
		t.Fatal(err)
	}
	hold, held := make(chan struct{}), make(chan struct{})
	j.w.beforeCommit = func(int) error {
		select {
		case <-held:
		default:
			close(held)
			<-hold
		}
		return nil
	}
	first := make(chan error, 1)
	go func() { first <- j.Start("held") }()
	<-held
	finished := make(chan error, 1)
	go func() { finished <- j.Finish("result", []byte("r")) }()
	for queued := 0; queued != 1; {
		time.Sleep(time.Millisecond)
		j.w.mu.Lock()
		queued = len(j.w.queue)
		j.w.mu.Unlock()
	}
	j.AckResult("acked") // queued behind the Finish, for the same group
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
	for _, f := range logs {
		f.Cut()
	}
	j.Close()
	createLog = wal.Create
	j2 := open(t, dir, "cut")
	defer j2.Close()
	if e, _ := j2.Get("result"); e == nil || e.State != Done {
		t.Fatalf("a result answered before its group was fdatasynced: after a power cut it is %+v", e)
	}
}
