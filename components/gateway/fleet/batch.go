package fleet

import (
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
)

// SubmitBatch stores and sends every command of a batch with its
// BatchLeaf, as SubmitCommand does: a signed command keeps its signature;
// an unsigned one is signed with bcgw's own command key when it has one
// (the batch leaf, not the command's signature, carries the approvers'
// say; agents that enforce signed intent still need a root's signature).
// It refuses the whole batch, before storing anything, when the file is
// malformed, the batch expired, a node is unknown or revoked, a deadline
// passed or a command id exists. Each view's warning says when agents
// holding the current trust bundle will refuse that command (its
// signature, or for a destructive kind its approvals under the bundle's
// approver set).
func (s *Fleet) SubmitBatch(bf adminapi.BatchFile) (adminapi.BatchSubmitView, error) {
	h, frames, err := bf.Check()
	if err != nil {
		return adminapi.BatchSubmitView{}, fmt.Errorf("batch file: %w", err)
	}
	now := s.now()
	if now.UnixMilli() > h.NotAfterUnixMS {
		return adminapi.BatchSubmitView{}, fmt.Errorf("batch %s expired at %s; create it again and have it approved again",
			h.BatchID, time.UnixMilli(h.NotAfterUnixMS).UTC().Format(time.RFC3339))
	}
	for i, f := range frames {
		if n, err := s.store.Node(f.GetNodeId()); err != nil {
			return adminapi.BatchSubmitView{}, fmt.Errorf("command %d (%s): node %s: %w", i, f.GetId(), f.GetNodeId(), err)
		} else if n.Revoked {
			return adminapi.BatchSubmitView{}, fmt.Errorf("command %d (%s): node %s is revoked", i, f.GetId(), f.GetNodeId())
		}
		if dl := time.UnixMilli(f.GetDeadlineUnixMs()); !dl.After(now) {
			return adminapi.BatchSubmitView{}, fmt.Errorf("command %d (%s): its deadline %s has passed; prepare it again (with a longer --deadline) and create the batch again",
				i, f.GetId(), dl.UTC().Format(time.RFC3339))
		}
		if _, err := s.store.Command(f.GetId()); err == nil {
			return adminapi.BatchSubmitView{}, fmt.Errorf("command %d: command %s exists already (was this batch submitted before?)", i, f.GetId())
		}
	}
	s.trust.mu.Lock()
	doc := s.trust.doc
	s.trust.mu.Unlock()
	roots := doc.Roots()
	var set *quorum.Set
	out := adminapi.BatchSubmitView{BatchID: h.BatchID, Commands: []adminapi.CommandView{}}
	if doc.Approvers != nil {
		if st, err := doc.Approvers.Set(); err == nil {
			set = &st
		}
	} else {
		out.Warning = fmt.Sprintf("trust bundle version %d names no approver set: agents do not check batch leaves (bcgw trust approvers set)", doc.Version)
	}
	for i, f := range frames {
		if len(f.GetSignature()) == 0 && s.commandKey() != nil {
			sig, err := intent.SignCommand(s.commandKey(), f)
			if err != nil {
				return out, fmt.Errorf("command %d (%s): sign it: %w", i, f.GetId(), err)
			}
			f.Signature = sig
		}
		var refusals []string
		if err := roots.VerifyCommand(f); err != nil {
			refusals = append(refusals, err.Error())
		}
		if set != nil && quorum.IsDestructive(f.GetKind()) {
			if _, err := quorum.Verify(f, *set, now); err != nil {
				refusals = append(refusals, err.Error())
			}
		}
		b := f.GetBatch()
		c := store.Command{ID: f.GetId(), NodeID: f.GetNodeId(), Kind: f.GetKind(), Body: f.GetBody(), DeadlineMS: f.GetDeadlineUnixMs(),
			Lane: f.GetLane(), WorkflowID: f.GetWorkflowId(), Signature: f.GetSignature(),
			Batch: &store.BatchLeaf{Header: b.GetHeader(), Approvals: b.GetApprovals(), Index: b.GetIndex(), Proof: b.GetProof()},
			// A nanosecond apart: re-sends after a redial keep the batch's order.
			CreatedAt: now.Add(time.Duration(i)).UTC()}
		if err := s.store.AddCommand(c); err != nil {
			return out, fmt.Errorf("command %d (%s): %w (the %d commands before it were sent)", i, c.ID, err, i)
		}
		c.State = store.StatePending
		s.noteUpgrade(c)
		s.pushCommand(c)
		v := ViewCommand(c)
		if len(refusals) > 0 {
			v.Warning = fmt.Sprintf("agents that hold trust bundle version %d refuse it: %s", doc.Version, strings.Join(refusals, "; "))
		}
		out.Commands = append(out.Commands, v)
		s.log.Info("command submitted", "node", c.NodeID, "command_id", c.ID, "kind", c.Kind, "signed", len(c.Signature) > 0,
			"batch", h.BatchID, "leaf", i, "warning", v.Warning)
	}
	return out, nil
}

// UnbatchedWarning says, for a destructive kind sent without a batch
// while the trust bundle names approvers, that agents refuse it ("" when
// they would not).
func (s *Fleet) UnbatchedWarning(kind string) string {
	if !quorum.IsDestructive(kind) {
		return ""
	}
	s.trust.mu.Lock()
	a, v := s.trust.doc.Approvers, s.trust.doc.Version
	s.trust.mu.Unlock()
	if a == nil {
		return ""
	}
	return fmt.Sprintf("trust bundle version %d names approvers (epoch %d): agents refuse %s without an approved batch leaf (BATCH_UNAPPROVED) beyond their [intent] unbatched_destructive_per_hour (default 0); send it in a batch (bcgw batch create)",
		v, a.Epoch, kind)
}

// joinWarnings joins the non-empty warnings.
func joinWarnings(ws ...string) string {
	var out []string
	for _, w := range ws {
		if w != "" {
			out = append(out, w)
		}
	}
	return strings.Join(out, "; ")
}
