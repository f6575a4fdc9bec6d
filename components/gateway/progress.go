package gateway

import (
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// progressBook holds the latest CommandProgress of each running command,
// in memory only: progress is best effort, and a result replaces it.
type progressBook struct {
	mu sync.Mutex
	m  map[string]progressEntry
}

type progressEntry struct {
	detail json.RawMessage
	at     time.Time
}

// maxProgressEntries bounds the book; beyond it new commands' progress is
// dropped until results clear old entries.
const maxProgressEntries = 100000

// storeProgress keeps a node's progress report for one of its running
// commands.
func (s *Server) storeProgress(nodeID string, p *bcdv1.CommandProgress) error {
	if len(p.GetDetail()) > 4<<10 || !json.Valid(p.GetDetail()) {
		return errors.New("progress detail is not JSON of at most 4 KiB")
	}
	c, err := s.store.Command(p.GetCommandId())
	if err != nil || c.NodeID != nodeID {
		return errors.New("progress for a command this node does not hold")
	}
	if c.State == store.StateDone {
		return nil // the result came first
	}
	b := &s.progress
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]progressEntry{}
	}
	if _, ok := b.m[c.ID]; !ok && len(b.m) >= maxProgressEntries {
		return errors.New("too many commands in progress")
	}
	b.m[c.ID] = progressEntry{detail: append(json.RawMessage(nil), p.GetDetail()...), at: s.now().UTC()}
	return nil
}

// dropProgress forgets a command's progress once its result is stored.
func (s *Server) dropProgress(id string) {
	s.progress.mu.Lock()
	delete(s.progress.m, id)
	s.progress.mu.Unlock()
}

// withProgress adds a running command's latest progress to its view.
func (s *Server) withProgress(v CommandView) CommandView {
	if v.State == store.StateDone {
		return v
	}
	s.progress.mu.Lock()
	e, ok := s.progress.m[v.ID]
	s.progress.mu.Unlock()
	if ok {
		v.Progress, v.ProgressAt = e.detail, &e.at
	}
	return v
}
