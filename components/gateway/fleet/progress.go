package fleet

import (
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
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
	// sent is when this gateway last passed the command's progress to the
	// other gateways (a notice at most every progressNoticeEvery).
	sent time.Time
}

// progressNoticeEvery bounds the progress notices of one command: the
// others see its progress at most this late, and the result anyway.
const progressNoticeEvery = time.Second

// progressKeep is how long another gateway's progress is kept without an
// update or a result (its result notice may be lost).
const progressKeep = time.Hour

// maxProgressEntries bounds the book; beyond it new commands' progress is
// dropped until results clear old entries.
const maxProgressEntries = 100000

// StoreProgress keeps a node's progress report for one of its running
// commands.
func (s *Fleet) StoreProgress(nodeID string, p *bcdv1.CommandProgress) error {
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
	now := s.now().UTC()
	detail := append(json.RawMessage(nil), p.GetDetail()...)
	tell, err := s.keepProgress(c.ID, detail, now, s.shared != nil)
	if tell {
		s.Notify(store.Notice{Kind: store.NoticeProgress, Node: nodeID, Command: c.ID, Detail: detail, At: now})
	}
	return err
}

// keepProgress puts a command's progress in the book; with tell, it
// reports whether the other gateways are due a notice of it.
func (s *Fleet) keepProgress(id string, detail json.RawMessage, at time.Time, tell bool) (bool, error) {
	b := &s.progress
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]progressEntry{}
	}
	old, ok := b.m[id]
	if !ok && len(b.m) >= maxProgressEntries {
		return false, errors.New("too many commands in progress")
	}
	if ok && at.Before(old.at) {
		return false, nil // an older report, come late through another gateway
	}
	e := progressEntry{detail: detail, at: at, sent: old.sent}
	due := tell && at.Sub(old.sent) >= progressNoticeEvery
	if due {
		e.sent = at
	}
	b.m[id] = e
	return due, nil
}

// progressNotice keeps the progress another gateway passed on.
func (s *Fleet) progressNotice(n store.Notice) {
	if len(n.Detail) > 4<<10 || !json.Valid(n.Detail) || n.Command == "" {
		return
	}
	s.keepProgress(n.Command, append(json.RawMessage(nil), n.Detail...), n.At, false)
}

// pruneProgress forgets progress not updated within progressKeep.
func (s *Fleet) pruneProgress() {
	cut := s.now().Add(-progressKeep)
	s.progress.mu.Lock()
	defer s.progress.mu.Unlock()
	for id, e := range s.progress.m {
		if e.at.Before(cut) {
			delete(s.progress.m, id)
		}
	}
}

// dropProgress forgets a command's progress once its result is stored.
func (s *Fleet) dropProgress(id string) {
	s.progress.mu.Lock()
	delete(s.progress.m, id)
	s.progress.mu.Unlock()
}

// WithProgress adds a running command's latest progress to its view.
func (s *Fleet) WithProgress(v adminapi.CommandView) adminapi.CommandView {
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
