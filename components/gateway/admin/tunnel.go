package admin

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

	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"

	"connectrpc.com/connect"
	"github.com/better-compute/bcd/components/base/flowwin"
	"github.com/better-compute/bcd/components/gateway/adminapi"
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

// adminTunnel is POST /v1/nodes/{id}/tunnel?kind=K&account=A&ttl=D
// [&instance=I], or POST /v1/instances/{instance}/tunnel?kind=K&... (the
// node that runs it found by the gateway), with Upgrade: bcd-tunnel.
func (s *API) adminTunnel(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), adminapi.TunnelUpgrade) {
		adminErr(w, http.StatusBadRequest, errors.New("a tunnel needs Upgrade: "+adminapi.TunnelUpgrade))
		return
	}
	q := r.URL.Query()
	req := adminapi.TunnelRequest{Kind: q.Get("kind"), Account: q.Get("account"), Instance: q.Get("instance")}
	if in := r.PathValue("instance"); in != "" {
		req.Instance = in
	}
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
	nt, c, err := s.svc.OpenTunnel(r.Context(), r.PathValue("id"), req)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadGateway), err)
		return
	}
	defer nt.Finish()
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
	carryAdmin(conn, brw.Reader, nt.Stream())
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
