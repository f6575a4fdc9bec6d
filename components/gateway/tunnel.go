package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/flowwin"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/ticket"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Tunnels through bcgw: `bcgw tunnel` and `bcgw console` ask the admin API
// for a tunnel (POST /v1/nodes/{id}/tunnel with Upgrade: bcd-tunnel);
// bcgw issues an exec ticket, sends OpenTunnel on the node's session and
// waits for the node's Tunnel stream. Once the node opened its target the
// admin connection is upgraded and carries the bytes: from the client in
// frames (TunnelFrameData, TunnelFrameResize, TunnelFrameClose), to the
// client as they come. Each side holds at most one frame of a tunnel;
// HTTP/2's flow control and the connection's own make a reader that stops
// reading stop the writer.

// Limits of bcgw's tunnels.
const (
	DefaultTicketTTL = 15 * time.Minute
	tunnelOpenWait   = 20 * time.Second
)

// openingTunnel waits for the node's Tunnel stream.
type openingTunnel struct {
	node  string
	ready chan *nodeTunnel
}

// nodeTunnel is the node's side of a tunnel: its stream, or its refusal.
type nodeTunnel struct {
	st      *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]
	refused string
	done    chan struct{} // closed when the admin side is finished
}

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
	o := &openingTunnel{node: node, ready: make(chan *nodeTunnel, 1)}
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
func (s *Server) Tunnel(ctx context.Context, st *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]) error {
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
	nt := &nodeTunnel{st: st, done: make(chan struct{})}
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

func clipStr(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// openTunnel issues the ticket, sends OpenTunnel and waits for the node.
func (s *Server) openTunnel(ctx context.Context, node string, r adminapi.TunnelRequest) (*nodeTunnel, ticket.Claims, error) {
	var c ticket.Claims
	if err := ticket.CheckKind(r.Kind); err != nil {
		return nil, c, err
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
	if on, connected := s.SessionOn(n); !connected {
		return nil, c, fmt.Errorf("node %s is not connected: a tunnel goes over its session", node)
	} else if on != s.cfg.Name {
		// The tunnel's bytes would have to cross between gateways, which
		// share a database and no stream (docs/gateway-store.md).
		return nil, c, fmt.Errorf("node %s's session is on gateway %s, not on this one (%s): a tunnel goes over its session, so open it there (bcgw --data-dir on that host)",
			node, on, s.cfg.Name)
	}
	key, err := s.TicketKey()
	if err != nil {
		return nil, c, err
	}
	now := s.now()
	c = ticket.Claims{Node: node, Kind: r.Kind, Account: r.Account, JTI: fleet.RandomID(15), Issued: now, Expiry: now.Add(r.TTL)}
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
		s.log.Info("tunnel open", "node", node, "tunnel_id", id, "kind", r.Kind, "account", r.Account, "jti", c.JTI)
		return nt, c, nil
	case <-t.C:
		s.tunnels.take(id)
		return nil, c, fmt.Errorf("node %s did not open the tunnel within %s", node, tunnelOpenWait)
	case <-ctx.Done():
		s.tunnels.take(id)
		return nil, c, ctx.Err()
	}
}

// adminTunnel is POST /v1/nodes/{id}/tunnel?kind=K&account=A&ttl=D with
// Upgrade: bcd-tunnel.
func (s *Server) adminTunnel(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), adminapi.TunnelUpgrade) {
		adminErr(w, http.StatusBadRequest, errors.New("a tunnel needs Upgrade: "+adminapi.TunnelUpgrade))
		return
	}
	q := r.URL.Query()
	req := adminapi.TunnelRequest{Kind: q.Get("kind"), Account: q.Get("account")}
	if req.Account == "" {
		req.Account = "operator"
	}
	if v := q.Get("ttl"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			adminErr(w, http.StatusBadRequest, fmt.Errorf("ttl: %w", err))
			return
		}
		req.TTL = d
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		adminErr(w, http.StatusInternalServerError, errors.New("this connection cannot carry a tunnel"))
		return
	}
	nt, c, err := s.openTunnel(r.Context(), r.PathValue("id"), req)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadGateway), err)
		return
	}
	defer close(nt.done)
	conn, brw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	conn.SetDeadline(time.Time{})
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\nBcd-Ticket-Id: %s\r\n\r\n", adminapi.TunnelUpgrade, c.JTI)
	if err := brw.Flush(); err != nil {
		return
	}
	carryAdmin(conn, brw.Reader, nt.st)
}

// closeWriter is a connection whose writing half closes alone.
type closeWriter interface{ CloseWrite() error }

// carryAdmin copies the client's frames to the node's stream and the
// node's data to the client until both ends are done. Each direction keeps
// to a flowwin window: the client's data waits for the node's acks, and
// the node's data is acked once written to the client.
func carryAdmin(conn net.Conn, rd *bufio.Reader, st *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]) {
	var sendMu sync.Mutex
	send := func(f *bcdv1.TunnelData) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(f)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	win := flowwin.New()
	defer win.Close()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // client -> node
		defer wg.Done()
		hdr := make([]byte, 5)
		for {
			if _, err := io.ReadFull(rd, hdr); err != nil {
				_ = send(&bcdv1.TunnelData{Close: true})
				return
			}
			n := binary.BigEndian.Uint32(hdr[1:])
			if n > adminapi.MaxTunnelFrame {
				_ = send(&bcdv1.TunnelData{Close: true})
				stop()
				conn.Close()
				return
			}
			buf := make([]byte, n)
			if _, err := io.ReadFull(rd, buf); err != nil {
				_ = send(&bcdv1.TunnelData{Close: true})
				return
			}
			var f *bcdv1.TunnelData
			switch hdr[0] {
			case adminapi.TunnelFrameData:
				if n == 0 {
					continue
				}
				if err := win.Take(ctx, int(n)); err != nil {
					return
				}
				f = &bcdv1.TunnelData{Data: buf}
			case adminapi.TunnelFrameResize:
				if n != 4 {
					continue
				}
				f = &bcdv1.TunnelData{Rows: uint32(binary.BigEndian.Uint16(buf)), Cols: uint32(binary.BigEndian.Uint16(buf[2:]))}
			case adminapi.TunnelFrameClose:
				_ = send(&bcdv1.TunnelData{Close: true})
				return
			default:
				continue
			}
			if err := send(f); err != nil {
				return
			}
		}
	}()
	// The node's frames: acks at once, data to the writer (at most a window).
	in := make(chan *bcdv1.TunnelData, flowwin.Size/adminapi.MaxTunnelFrame+4)
	go func() {
		defer wg.Done()
		defer close(in)
		for {
			f, err := st.Receive()
			if err != nil {
				return
			}
			if a := f.GetAck(); a > 0 {
				win.Ack(a)
			}
			if len(f.GetData()) > 0 || f.GetClose() {
				select {
				case in <- f:
				case <-ctx.Done():
					return
				}
			}
			if f.GetClose() {
				return
			}
		}
	}()
	var consumed flowwin.Consumed
	for f := range in {
		if len(f.GetData()) > 0 {
			if _, err := conn.Write(f.GetData()); err != nil {
				break
			}
			ack := consumed.Add(len(f.GetData()))
			if len(in) == 0 && ack == 0 {
				ack = consumed.Flush()
			}
			if ack > 0 {
				_ = send(&bcdv1.TunnelData{Ack: ack})
			}
		}
		if f.GetClose() {
			break
		}
	}
	if cw, ok := conn.(closeWriter); ok {
		cw.CloseWrite()
	} else {
		conn.Close()
	}
	// The client ends its side once it read the end (bcgw tunnel exits).
	wg.Wait()
}
