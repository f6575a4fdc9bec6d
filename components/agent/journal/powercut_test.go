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
					if _, _, err := j.Accept(id, "k", "", []byte("body")); err != nil {
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
