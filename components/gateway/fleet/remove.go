package fleet

import (
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
)

// RemoveNode forgets a node: it is revoked first (its live session gets
// the revocation notice and its agent exits), then its record, commands,
// spec, report and events go. Its certificate names a node no gateway
// knows from then on, so every session and renewal it tries is refused;
// the machine joins again as a new node.
func (s *Fleet) RemoveNode(id string) error {
	n, err := s.store.Node(id)
	if err != nil {
		return fmt.Errorf("node %s: %w (bcgw nodes lists the nodes this gateway knows)", id, err)
	}
	if !n.Revoked {
		if err := s.Revoke(id); err != nil {
			return err
		}
	}
	if err := s.store.DeleteNode(id); err != nil {
		return fmt.Errorf("remove node %s: %w", id, err)
	}
	s.dropNodeSecrets(id)
	s.log.Info("node removed", "node", id)
	return nil
}

// JoinTokens lists the join tokens (never their secrets), by id.
func (s *Fleet) JoinTokens() ([]adminapi.JoinTokenView, error) {
	ts, err := s.store.Tokens()
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make([]adminapi.JoinTokenView, 0, len(ts))
	for _, t := range ts {
		out = append(out, adminapi.JoinTokenView{ID: t.ID, Role: t.Role, Site: t.Site, Uses: t.Uses, Used: t.Used,
			CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, NodeID: t.NodeID, MAC: t.MAC, Command: t.Command,
			CloudAccount: t.CloudAccount, CloudRegion: t.CloudRegion,
			Spent:   t.Used >= t.Uses,
			Expired: !t.ExpiresAt.IsZero() && now.After(t.ExpiresAt)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RemoveJoinToken deletes a join token: no join is admitted with it from
// then on.
func (s *Fleet) RemoveJoinToken(id string) error {
	ts, err := s.store.Tokens()
	if err != nil {
		return err
	}
	for _, t := range ts {
		if t.ID == id {
			if err := s.store.DeleteToken(id); err != nil {
				return err
			}
			s.log.Info("join token removed", "token_id", id)
			return nil
		}
	}
	return fmt.Errorf("join token %s: %w (bcgw token ls lists them)", id, store.ErrNotFound)
}

// Backup writes a consistent copy of the bbolt store to w while the
// gateway serves; on a database it refuses (pg_dump backs that up).
func (s *Fleet) Backup(w io.Writer) (int64, error) {
	if s.cfg.Backup == nil {
		return 0, errors.New("this gateway's store is PostgreSQL: back it up with pg_dump (docs/gateway-store.md, \"Backup and restore\")")
	}
	return s.cfg.Backup(w)
}
