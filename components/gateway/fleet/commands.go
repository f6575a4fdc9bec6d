package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
)

// Revoke marks a node revoked, tells its live session and ends it.
func (s *Fleet) Revoke(nodeID string) error {
	if _, err := s.store.UpdateNode(nodeID, func(n *store.Node) error { n.Revoked = true; return nil }); err != nil {
		return fmt.Errorf("node %s: %w", nodeID, err)
	}
	if s.shared != nil {
		s.Notify(store.Notice{Kind: store.NoticeRevoke, Node: nodeID}) // whichever gateway holds its session ends it
	} else {
		s.hub.SendFinal(nodeID, RevocationFrame())
	}
	s.log.Info("node revoked", "node", nodeID)
	return nil
}

// SendCommand stores a command for a node and pushes it to its live session.
func (s *Fleet) SendCommand(nodeID, kind string, body []byte, deadline time.Duration) (store.Command, error) {
	return s.SendCommandWithSecrets(nodeID, kind, body, deadline, nil)
}

// SendCommandWithSecrets sends a command with secrets bound to it (the
// deploy.image user data): they are stored before the command is, and the
// agent fetches them with a SecretRequest naming the command, never in its
// body.
func (s *Fleet) SendCommandWithSecrets(nodeID, kind string, body []byte, deadline time.Duration, secrets map[string][]byte) (store.Command, error) {
	if kind == "" {
		return store.Command{}, errors.New("kind is required")
	}
	if len(body) > 1<<20 {
		return store.Command{}, errors.New("body is larger than 1 MiB")
	}
	if deadline <= 0 {
		deadline = 10 * time.Minute
	}
	if n, err := s.store.Node(nodeID); err != nil {
		return store.Command{}, fmt.Errorf("node %s: %w", nodeID, err)
	} else if n.Revoked {
		return store.Command{}, fmt.Errorf("node %s is revoked", nodeID)
	}
	now := s.now()
	c := store.Command{ID: newCommandID(), NodeID: nodeID, Kind: kind, Body: body, DeadlineMS: now.Add(deadline).UnixMilli(), CreatedAt: now.UTC()}
	if s.commandKey() != nil {
		// Signed once, here: every copy the agent gets carries these bytes.
		sig, err := intent.SignCommand(s.commandKey(), commandProto(c))
		if err != nil {
			return c, fmt.Errorf("sign the command: %w", err)
		}
		c.Signature = sig
	}
	for name, v := range secrets {
		if err := s.putCommandSecret(c.ID, name, v); err != nil {
			return c, err
		}
	}
	if err := s.store.AddCommand(c); err != nil {
		return c, err
	}
	c.State = store.StatePending
	s.noteUpgrade(c)
	s.pushCommand(c)
	s.log.Info("command sent", "node", nodeID, "command_id", c.ID, "kind", kind)
	return c, nil
}

// CancelCommand cancels a command: one the agent has not acked ends
// CANCELLED at once; one it holds gets a Cancel frame, and the agent ends
// it CANCELLED (a command that already finished keeps its result).
func (s *Fleet) CancelCommand(id, reason string) (store.Command, error) {
	if reason == "" {
		reason = "cancelled by an operator"
	}
	c, done, err := s.store.CancelPending(id, reason, s.now())
	if err != nil {
		return c, fmt.Errorf("command %s: %w", id, err)
	}
	if done {
		s.ResultStored(id) // it ended here: wake those waiting for it
	}
	if !done && c.State == store.StateDelivered && s.shared != nil {
		s.Notify(store.Notice{Kind: store.NoticeCancel, Node: c.NodeID, Command: id, Reason: reason})
	} else if !done && c.State == store.StateDelivered {
		cf := &bcdv1.Cancel{CommandId: id, Reason: reason}
		if s.commandKey() != nil {
			if cf.Signature, err = intent.SignCancel(s.commandKey(), c.NodeID, cf); err != nil {
				return c, fmt.Errorf("signing the cancel of %s: %w", id, err)
			}
		}
		s.hub.Send(c.NodeID, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Cancel{Cancel: cf}})
	}
	s.log.Info("command cancel", "command_id", id, "node", c.NodeID, "before_delivery", done)
	return c, nil
}

// newCommandID makes a command id: cmd_ and 21 base32 characters.
func newCommandID() string { return "cmd_" + RandomID(13) }

// commandProto is the Command frame of a stored command, its signature
// and batch leaf included.
func commandProto(c store.Command) *bcdv1.Command {
	cmd := &bcdv1.Command{
		Id: c.ID, NodeId: c.NodeID, Kind: c.Kind, Body: c.Body, DeadlineUnixMs: c.DeadlineMS,
		Lane: c.Lane, WorkflowId: c.WorkflowID, Signature: c.Signature,
	}
	if b := c.Batch; b != nil {
		cmd.Batch = &bcdv1.BatchLeaf{Header: b.Header, Approvals: b.Approvals, Index: b.Index, Proof: b.Proof}
	}
	return cmd
}

func CommandFrame(c store.Command) *bcdv1.GatewayFrame {
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_Command{Command: commandProto(c)}}
}

// WaitResult returns a channel closed when a result for id is stored
// (or cancel is called).
func (s *Fleet) WaitResult(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	if s.waiters == nil {
		s.waiters = map[string][]chan struct{}{}
	}
	s.waiters[id] = append(s.waiters[id], ch)
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w := s.waiters[id]
		for i, c := range w {
			if c == ch {
				s.waiters[id] = append(w[:i], w[i+1:]...)
				break
			}
		}
		if len(s.waiters[id]) == 0 {
			delete(s.waiters, id)
		}
	}
}

// ResultStored is called once when command id ends (its result stored, or
// cancelled before delivery): it drops the command's progress and the
// state kept for it (its secrets), and wakes the admin calls waiting for
// it.
func (s *Fleet) ResultStored(id string) {
	s.dropProgress(id)
	s.dropCommandState(id)
	s.mu.Lock()
	w := s.waiters[id]
	delete(s.waiters, id)
	s.mu.Unlock()
	for _, c := range w {
		close(c)
	}
}

// Connected reports whether a node has a live session.
func (s *Fleet) Connected(nodeID string) bool { return s.hub.Connected(nodeID) }

func ViewCommand(c store.Command) adminapi.CommandView {
	v := adminapi.CommandView{ID: c.ID, Node: c.NodeID, Kind: c.Kind, State: c.State, Deadline: time.UnixMilli(c.DeadlineMS).UTC(), ResultCopies: c.ResultCopies,
		Signed: len(c.Signature) > 0}
	if b := c.Batch; b != nil {
		h, _ := quorum.DecodeHeader(b.Header) // checked when it was submitted
		v.Batch = &adminapi.CommandBatch{ID: h.BatchID, Index: b.Index}
	}
	if r := c.Result; r != nil {
		v.Status, v.Error = r.Status, r.Error
		v.Attested, v.Attestation = len(r.Attestation) > 0, r.Attestation
		if json.Valid(r.Output) {
			v.Output = r.Output
		} else if len(r.Output) > 0 {
			b, _ := json.Marshal(string(r.Output))
			v.Output = b
		}
	}
	return v
}
