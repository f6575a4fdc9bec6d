package fleet

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/release"
)

// Each node's latest daemon.upgrade is kept in the store (meta
// upgrade/<node>), whichever way it was sent (bcgw upgrade, bcgw run, a
// signed or batched command), so `bcgw status` shows its progress on any
// gateway and any admin host (docs/update.md).
const upgradeMetaPrefix = "upgrade/"

type upgradeRecord struct {
	Command string    `json:"command"`
	Version string    `json:"version,omitempty"`
	Sent    time.Time `json:"sent"`
}

// noteUpgrade records c as its node's latest upgrade when it is a
// daemon.upgrade; a failure to record is logged, not the command's.
func (s *Fleet) noteUpgrade(c store.Command) {
	if c.Kind != release.UpgradeKind {
		return
	}
	rec := upgradeRecord{Command: c.ID, Sent: c.CreatedAt}
	var body release.UpgradeBody
	if json.Unmarshal(c.Body, &body) == nil {
		if _, m, err := release.Decode(body.Release); err == nil {
			rec.Version = m.Version
		}
	}
	b, _ := json.Marshal(rec)
	// Over the stored record unless that one was sent later: two gateways
	// sending upgrades to one node at once leave the later one, whichever
	// writes last.
	err := store.UpdateMeta(s.store, upgradeMetaPrefix+c.NodeID, 8, func(old []byte) ([]byte, error) {
		var have upgradeRecord
		if len(old) > 0 && json.Unmarshal(old, &have) == nil && have.Sent.After(rec.Sent) {
			return nil, nil
		}
		return b, nil
	})
	if err != nil {
		s.log.Warn("recording the node's upgrade for bcgw status", "node", c.NodeID, "command_id", c.ID, "err", err)
	}
}

// upgradeView is the node's latest upgrade, or nil when it had none.
func (s *Fleet) upgradeView(node string) (*adminapi.UpgradeView, error) {
	b, err := s.store.Meta(upgradeMetaPrefix + node)
	if errors.Is(err, store.ErrNotFound) || err == nil && len(b) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec upgradeRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, nil // an unreadable record shows nothing rather than failing the status
	}
	c, err := s.store.Command(rec.Command)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil // swept with the command
	}
	if err != nil {
		return nil, err
	}
	return &adminapi.UpgradeView{Version: rec.Version, Sent: rec.Sent, Command: s.WithProgress(ViewCommand(c))}, nil
}
