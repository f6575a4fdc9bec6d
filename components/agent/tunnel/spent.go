package tunnel

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
)

// SpentFile is the spent exec-ticket ids under data_dir, beside the
// journal.
const SpentFile = "spent-tickets.json"

// KeepAfterExpiry is how long a spent jti is kept after its ticket expired
// (a ticket is refused once expired anyway; the margin covers clock skew).
const KeepAfterExpiry = 5 * time.Minute

// MaxSpent bounds the set: at 16 tunnels at once and tickets of at most
// 15 minutes, a node that spends more is being flooded; it refuses.
const MaxSpent = 100_000

// ErrSpent is a ticket whose jti opened a tunnel already.
var ErrSpent = errors.New("exec ticket already used (each ticket opens one tunnel)")

// Spent is the durable set of spent jtis: each Spend is fsynced before the
// tunnel opens, so a ticket opens at most one tunnel, across restarts.
type Spent struct {
	mu   sync.Mutex
	path string
	ids  map[string]int64 // jti -> the ticket's expiry (unix seconds)
	bad  error            // the file was unreadable: every ticket is refused
}

type spentFile struct {
	V     int              `json:"v"`
	Spent map[string]int64 `json:"spent"`
}

// OpenSpent loads the set. An unreadable file is not moved aside: the set
// refuses every ticket (a lost set would let tickets be used again) until
// the file is repaired or removed by hand.
func OpenSpent(dataDir string) *Spent {
	s := &Spent{path: dataDir + "/" + SpentFile, ids: map[string]int64{}}
	b, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		s.bad = fmt.Errorf("reading %s: %w", s.path, err)
	default:
		var f spentFile
		if err := json.Unmarshal(b, &f); err != nil || f.V != 1 {
			s.bad = fmt.Errorf("%s is not a spent-ticket set (remove it only if no ticket issued in the last 20 minutes may be replayed): %v", s.path, err)
		} else if f.Spent != nil {
			s.ids = f.Spent
		}
	}
	return s
}

// Spend records jti (its ticket expiring at exp) as spent, durably, or
// fails with ErrSpent when it is already. Entries are dropped
// KeepAfterExpiry after their expiry.
func (s *Spent) Spend(jti string, exp, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bad != nil {
		return s.bad
	}
	if _, ok := s.ids[jti]; ok {
		return ErrSpent
	}
	next := make(map[string]int64, len(s.ids)+1)
	for id, e := range s.ids {
		if now.Before(time.Unix(e, 0).Add(KeepAfterExpiry)) {
			next[id] = e
		}
	}
	if len(next) >= MaxSpent {
		return fmt.Errorf("%d exec tickets spent in the last 20 minutes; refusing more", len(next))
	}
	next[jti] = exp.Unix()
	b, err := json.Marshal(spentFile{V: 1, Spent: next})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path, b, 0o600); err != nil {
		return fmt.Errorf("recording the spent ticket: %w", err)
	}
	s.ids = next
	return nil
}
