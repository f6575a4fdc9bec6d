package agentsvc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/ticket"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Limits of bcgw's tunnels.
const (
	DefaultTicketTTL = 15 * time.Minute
	tunnelOpenWait   = 20 * time.Second
)

// openingTunnel waits for the node's Tunnel stream.
type openingTunnel struct {
	node  string
	ready chan *NodeTunnel
}

// NodeTunnel is the node's side of a tunnel: its stream, or its refusal.
type NodeTunnel struct {
	st      *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]
	refused string
	done    chan struct{} // closed when the admin side is finished
}

// Stream is the node's Tunnel stream.
func (t *NodeTunnel) Stream() *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData] { return t.st }

// Finish says the admin side is finished: the node's stream ends.
func (t *NodeTunnel) Finish() { close(t.done) }

type tunnelBook struct {
	mu      sync.Mutex
	pending map[string]*openingTunnel
}

func (b *tunnelBook) add(id, node string) *openingTunnel {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending == nil {
		b.pending = map[string]*openingTunnel{}
	}
	o := &openingTunnel{node: node, ready: make(chan *NodeTunnel, 1)}
	b.pending[id] = o
	return o
}

func (b *tunnelBook) take(id string) *openingTunnel {
	b.mu.Lock()
	defer b.mu.Unlock()
	o := b.pending[id]
	delete(b.pending, id)
	return o
}

// Tunnel is the node's side: its first frame names a tunnel bcgw asked it
// to open (of the same node), and then the stream carries its bytes until
// the admin side is finished.
func (s *Service) Tunnel(ctx context.Context, st *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]) error {
	n, _, err := s.peerNode(ctx)
	if err != nil {
		return err
	}
	if n.Revoked {
		return connectErr(connect.CodePermissionDenied, "this node's certificate was revoked")
	}
	first, err := st.Receive()
	if err != nil {
		return err
	}
	o := s.tunnels.take(first.GetTunnelId())
	if o == nil || o.node != n.ID {
		return connectErr(connect.CodeNotFound, "no tunnel %q is waiting for this node", clipStr(first.GetTunnelId()))
	}
	nt := &NodeTunnel{st: st, done: make(chan struct{})}
	if first.GetError() != "" || first.GetClose() {
		nt.refused = first.GetError()
		if nt.refused == "" {
			nt.refused = "the node closed the tunnel"
		}
		close(nt.done)
		o.ready <- nt
		return nil
	}
	o.ready <- nt
	select {
	case <-nt.done:
	case <-ctx.Done():
	}
	return nil
}

// nodeRunning is the one node with a session on this gateway whose
// desired spec has instance in one of states (a tunnel goes over the
// node's session, so only those nodes can carry it).
func (s *Service) nodeRunning(instance string, states []string) (string, error) {
	var found []string
	for _, l := range s.hub.All() {
		if s.instanceIn(l.NodeID, instance, states...) == nil {
			found = append(found, l.NodeID)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no node connected to this gateway (%s) runs instance %s: name the node (bcgw tunnel NODE --instance %s)", s.cfg.Name, instance, instance)
	case 1:
		return found[0], nil
	}
	slices.Sort(found)
	return "", fmt.Errorf("instance %s is in the specs of nodes %s: name the node", instance, strings.Join(found, ", "))
}

func clipStr(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// OpenTunnel issues the ticket, sends OpenTunnel and waits for the node.
// An instance tunnel's ticket names the instance, which the node's
// desired spec must run; the node checks again that it runs there.
func (s *Service) OpenTunnel(ctx context.Context, node string, r adminapi.TunnelRequest) (*NodeTunnel, ticket.Claims, error) {
	var c ticket.Claims
	if err := ticket.CheckKind(r.Kind); err != nil {
		return nil, c, err
	}
	if r.Instance != "" && !ticket.InstanceID(r.Instance) {
		return nil, c, fmt.Errorf("instance %q is not an instance id ([A-Za-z0-9][A-Za-z0-9_-], 1 to 64)", clipStr(r.Instance))
	}
	// A paused instance's console may be open (the node checks the
	// instance runs before it dials anything).
	states := []string{"RUNNING"}
	if r.Kind == ticket.KindConsole {
		states = append(states, "PAUSED")
	}
	if node == "" {
		if r.Instance == "" {
			return nil, c, fmt.Errorf("no node named")
		}
		var err error
		if node, err = s.nodeRunning(r.Instance, states); err != nil {
			return nil, c, err
		}
	}
	if r.TTL == 0 {
		r.TTL = DefaultTicketTTL
	}
	if r.TTL < 10*time.Second || r.TTL > ticket.MaxLifetime {
		return nil, c, fmt.Errorf("ttl must be from 10s to %s", ticket.MaxLifetime)
	}
	n, err := s.NodeForSpec(node)
	if err != nil {
		return nil, c, err
	}
	if r.Instance != "" {
		if err := s.instanceIn(node, r.Instance, states...); err != nil {
			return nil, c, fmt.Errorf("no tunnel to instance %s: %w", r.Instance, err)
		}
	}
	if on, connected := s.SessionOn(n); !connected {
		return nil, c, fmt.Errorf("node %s is not connected: a tunnel goes over its session", node)
	} else if on != s.cfg.Name {
		// The tunnel's bytes would have to cross between gateways, which
		// share a database and no stream (docs/gateway-store.md).
		return nil, c, fmt.Errorf("node %s's session is on gateway %s, not on this one (%s): a tunnel goes over its session, so open it there (bcgw --data-dir on that host)",
			node, on, s.cfg.Name)
	}
	if l := s.hub.Get(node); l != nil && l.WebSocket {
		return nil, c, fmt.Errorf("node %s is connected over the WebSocket fallback, which carries no tunnels: a tunnel needs the node's HTTP/2 session to the gateway", node)
	}
	key, err := s.TicketKey()
	if err != nil {
		return nil, c, err
	}
	now := s.now()
	c = ticket.Claims{Node: node, Kind: r.Kind, Account: r.Account, Instance: r.Instance, JTI: fleet.RandomID(15), Issued: now, Expiry: now.Add(r.TTL)}
	tok, err := ticket.Sign(key, fleet.TicketKID, c)
	if err != nil {
		return nil, c, err
	}
	id := fleet.RandomID(15)
	o := s.tunnels.add(id, node)
	s.hub.Send(node, &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_OpenTunnel{OpenTunnel: &bcdv1.OpenTunnel{TunnelId: id, Target: r.Kind, Ticket: tok}}})
	t := time.NewTimer(tunnelOpenWait)
	defer t.Stop()
	select {
	case nt := <-o.ready:
		if nt.refused != "" {
			return nil, c, fmt.Errorf("node %s refused the tunnel: %s", node, nt.refused)
		}
		s.log.Info("tunnel open", "node", node, "tunnel_id", id, "kind", r.Kind, "instance", r.Instance, "account", r.Account, "jti", c.JTI)
		return nt, c, nil
	case <-t.C:
		s.tunnels.take(id)
		return nil, c, fmt.Errorf("node %s did not open the tunnel within %s", node, tunnelOpenWait)
	case <-ctx.Done():
		s.tunnels.take(id)
		return nil, c, ctx.Err()
	}
}
