package quorum

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
)

// LedgerFile is the spent-leaf ledger under data_dir.
const LedgerFile = "batch-leaves.json"

// ledger is the file: spent leaves (batch/index -> the command that spent
// it and when its batch expires) and the times of unbatched destructive
// commands within the last hour.
type ledger struct {
	Leaves    map[string]spent `json:"leaves"`
	Unbatched []int64          `json:"unbatched_unix_ms"`
}

type spent struct {
	Command  string `json:"command"`
	NotAfter int64  `json:"not_after_unix_ms"`
}

// Ledger keeps each batch leaf to one run and counts unbatched
// destructive commands per rolling hour of the host clock, in data_dir,
// fsynced before the command it admits runs. Safe for concurrent use.
type Ledger struct {
	path string
	mu   sync.Mutex
	l    ledger
}

// OpenLedger reads dataDir's ledger (none: empty). An unreadable ledger
// is an error: forgetting spent leaves would let them run again.
func OpenLedger(dataDir string) (*Ledger, error) {
	lg := &Ledger{path: filepath.Join(dataDir, LedgerFile), l: ledger{Leaves: map[string]spent{}}}
	b, err := os.ReadFile(lg.path)
	if errors.Is(err, fs.ErrNotExist) {
		return lg, nil
	}
	if err != nil {
		return nil, fmt.Errorf("batch ledger: %w", err)
	}
	if err := json.Unmarshal(b, &lg.l); err != nil {
		return nil, fmt.Errorf("batch ledger %s is damaged (move it aside only if no batch of it can still be valid): %w", lg.path, err)
	}
	if lg.l.Leaves == nil {
		lg.l.Leaves = map[string]spent{}
	}
	return lg, nil
}

func (lg *Ledger) save() error {
	b, err := json.Marshal(lg.l)
	if err != nil {
		return err
	}
	return atomicfile.Write(lg.path, b, 0o600)
}

// Spend records v's leaf as run by commandID, or refuses it (ErrUnapproved)
// when a command already spent it. Leaves of batches expired for a day are
// dropped: an expired batch verifies for nothing.
func (lg *Ledger) Spend(v Verified, commandID string, now time.Time) error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if s, ok := lg.l.Leaves[v.Key()]; ok {
		return fmt.Errorf("%w: leaf %d of batch %s already ran (command %s)", ErrUnapproved, v.Index, v.BatchID, s.Command)
	}
	for k, s := range lg.l.Leaves {
		if time.UnixMilli(s.NotAfter).Add(24 * time.Hour).Before(now) {
			delete(lg.l.Leaves, k)
		}
	}
	lg.l.Leaves[v.Key()] = spent{Command: commandID, NotAfter: v.NotAfter.UnixMilli()}
	if err := lg.save(); err != nil {
		delete(lg.l.Leaves, v.Key())
		return fmt.Errorf("recording batch leaf %s: %w", v.Key(), err)
	}
	return nil
}

// Release gives back a leaf Spend recorded for commandID, when the command
// was not queued after all (nothing ran).
func (lg *Ledger) Release(v Verified, commandID string) error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	if s, ok := lg.l.Leaves[v.Key()]; !ok || s.Command != commandID {
		return nil
	}
	delete(lg.l.Leaves, v.Key())
	return lg.save()
}

// Unbatched admits one unbatched destructive command when fewer than
// limit ran in the hour before now, recording it; otherwise ErrUnapproved.
func (lg *Ledger) Unbatched(limit int, now time.Time) error {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	hourAgo := now.Add(-time.Hour).UnixMilli()
	kept := lg.l.Unbatched[:0]
	for _, t := range lg.l.Unbatched {
		if t > hourAgo {
			kept = append(kept, t)
		}
	}
	lg.l.Unbatched = kept
	if len(kept) >= limit {
		return fmt.Errorf("%w: %d unbatched destructive commands in the last hour, the limit is %d", ErrUnapproved, len(kept), limit)
	}
	lg.l.Unbatched = append(lg.l.Unbatched, now.UnixMilli())
	if err := lg.save(); err != nil {
		lg.l.Unbatched = lg.l.Unbatched[:len(lg.l.Unbatched)-1]
		return err
	}
	return nil
}
