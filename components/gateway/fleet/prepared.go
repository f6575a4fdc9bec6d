package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
)

// signatureWarning says why agents that hold the current trust bundle
// would refuse what verify checks ("" when they would take it).
func (s *Fleet) signatureWarning(verify func(r *intent.Roots) error) string {
	s.trust.mu.Lock()
	v, roots := s.trust.doc.Version, s.trust.doc.Roots()
	s.trust.mu.Unlock()
	if err := verify(roots); err != nil {
		return fmt.Sprintf("agents that hold trust bundle version %d refuse it: %v", v, err)
	}
	return ""
}

// PrepareCommand makes a command for node without storing or sending it:
// a new id, the deadline from now, no signature. The gateway reserves
// nothing; SubmitCommand stores it.
func (s *Fleet) PrepareCommand(nodeID, kind string, body []byte, deadline time.Duration) (adminapi.PreparedCommand, error) {
	if deadline <= 0 {
		deadline = 10 * time.Minute
	}
	if n, err := s.store.Node(nodeID); err != nil {
		return adminapi.PreparedCommand{}, fmt.Errorf("node %s: %w", nodeID, err)
	} else if n.Revoked {
		return adminapi.PreparedCommand{}, fmt.Errorf("node %s is revoked", nodeID)
	}
	b, err := adminapi.CompactJSON(body)
	if err != nil {
		return adminapi.PreparedCommand{}, fmt.Errorf("body is not JSON: %w", err)
	}
	p := adminapi.PreparedCommand{ID: newCommandID(), NodeID: nodeID, Kind: kind, DeadlineMS: s.now().Add(deadline).UnixMilli(), Body: b}
	if _, err := p.Frame(); err != nil {
		return adminapi.PreparedCommand{}, err
	}
	return p, nil
}

// SubmitCommand stores a prepared command, with the signature it carries
// (none for one submitted unsigned), and sends it; bcgw never signs it.
// It refuses malformed fields, an unknown or revoked node, a passed
// deadline and an id that exists. The warning says when agents holding
// the current trust bundle will refuse it.
func (s *Fleet) SubmitCommand(p adminapi.PreparedCommand, secrets map[string][]byte) (store.Command, string, error) {
	f, err := p.Frame()
	if err != nil {
		return store.Command{}, "", err
	}
	if n, err := s.store.Node(f.GetNodeId()); err != nil {
		return store.Command{}, "", fmt.Errorf("node %s: %w", f.GetNodeId(), err)
	} else if n.Revoked {
		return store.Command{}, "", fmt.Errorf("node %s is revoked", f.GetNodeId())
	}
	now := s.now()
	if dl := time.UnixMilli(f.GetDeadlineUnixMs()); !dl.After(now) {
		return store.Command{}, "", fmt.Errorf("the command's deadline %s has passed; prepare it again (with a longer --deadline)", dl.UTC().Format(time.RFC3339))
	}
	if _, err := s.store.Command(f.GetId()); err == nil {
		return store.Command{}, "", fmt.Errorf("command %s exists already (was this file submitted before?)", f.GetId())
	}
	c := store.Command{ID: f.GetId(), NodeID: f.GetNodeId(), Kind: f.GetKind(), Body: f.GetBody(), DeadlineMS: f.GetDeadlineUnixMs(),
		Lane: f.GetLane(), WorkflowID: f.GetWorkflowId(), Signature: f.GetSignature(), CreatedAt: now.UTC()}
	warning := joinWarnings(s.signatureWarning(func(r *intent.Roots) error { return r.VerifyCommand(f) }), s.UnbatchedWarning(f.GetKind()))
	for name, v := range secrets {
		if err := s.putCommandSecret(c.ID, name, v); err != nil {
			return c, "", err
		}
	}
	if err := s.store.AddCommand(c); err != nil {
		return c, "", err
	}
	c.State = store.StatePending
	s.noteUpgrade(c)
	s.pushCommand(c)
	s.log.Info("command submitted", "node", c.NodeID, "command_id", c.ID, "kind", c.Kind, "signed", len(c.Signature) > 0, "warning", warning)
	return c, warning, nil
}

// PrepareSpec works out the next generation of a node's desired spec from
// spec (a full NodeSpec, or with patch an RFC 7396 merge patch) without
// storing it: the DesiredState that SubmitSpec will store and send.
func (s *Fleet) PrepareSpec(node string, spec []byte, patch bool) (adminapi.PreparedSpec, error) {
	n, err := s.NodeForSpec(node)
	if err != nil {
		return adminapi.PreparedSpec{}, err
	}
	f, err := specChangeFor(n, spec, patch)
	if err != nil {
		return adminapi.PreparedSpec{}, err
	}
	unlock := s.specLocks.lock(node)
	p, err := s.planSpec(node, f)
	unlock()
	if errors.Is(err, errNoChange) {
		return adminapi.PreparedSpec{}, fmt.Errorf("nothing to prepare: the desired spec of %s is that already (generation %d)", node, p.base)
	}
	if err != nil {
		return adminapi.PreparedSpec{}, err
	}
	sp := adminapi.PreparedSpec{Node: node, Generation: p.ds.GetGeneration(), Patch: p.ds.GetPatch(), BaseGeneration: p.ds.GetBaseGeneration(), Spec: p.ds.GetSpec()}
	if sp.Patch {
		sp.Full = p.next
	}
	return sp, nil
}

// SubmitSpec stores a prepared spec change as the node's next generation
// and sends it with the signature it carries (none for one submitted
// unsigned); bcgw never signs it. It is refused when the node's spec
// generation moved since it was prepared, and when the spec is not the
// one prepare printed. The warning says when agents holding the current
// trust bundle will refuse it.
func (s *Fleet) SubmitSpec(p adminapi.PreparedSpec) (uint64, string, error) {
	ds, err := p.Frame()
	if err != nil {
		return 0, "", err
	}
	n, err := s.NodeForSpec(p.Node)
	if err != nil {
		return 0, "", err
	}
	f, err := specChangeFor(n, ds.GetSpec(), ds.GetPatch())
	if err != nil {
		return 0, "", err
	}
	unlock := s.specLocks.lock(p.Node)
	defer unlock()
	cur, err := s.store.Spec(p.Node)
	if err != nil {
		return 0, "", err
	}
	if cur.Generation != ds.GetGeneration()-1 {
		return 0, "", fmt.Errorf("the desired spec of %s is at generation %d; this was prepared as generation %d (on %d): %w",
			p.Node, cur.Generation, ds.GetGeneration(), ds.GetGeneration()-1, adminapi.ErrPreparedStale)
	}
	plan, err := s.planSpec(p.Node, f)
	if errors.Is(err, errNoChange) {
		return 0, "", fmt.Errorf("the desired spec of %s is that already (generation %d); nothing stored", p.Node, plan.base)
	}
	if err != nil {
		return 0, "", err
	}
	if !bytes.Equal(plan.ds.GetSpec(), ds.GetSpec()) {
		return 0, "", fmt.Errorf("the spec is not as bcgw spec prepare printed it (a full spec is stored in its canonical form; only whitespace may change): %w", adminapi.ErrPreparedStale)
	}
	full, err := nodespec.Decode(plan.next)
	if err != nil {
		return 0, "", err
	}
	warning := s.signatureWarning(func(r *intent.Roots) error { return r.VerifyDesiredState(p.Node, ds, full) })
	gen, err := s.commitSpecLocked(p.Node, plan, true, ds.GetSignature())
	if errors.Is(err, store.ErrGenerationMoved) {
		err = fmt.Errorf("%w; %w", err, adminapi.ErrPreparedStale)
	}
	if err == nil {
		s.log.Info("desired spec submitted", "node", p.Node, "generation", gen, "patch", ds.GetPatch(), "signed", len(ds.GetSignature()) > 0, "warning", warning)
	}
	return gen, warning, err
}
