package transport

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/trust/wsproof"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// The WebSocket fallback (docs/protocol.md#the-websocket-fallback): for a
// node behind a proxy that terminates TLS and strips client certificates.
// TLS reaches only the proxy, so it is checked against [websocket] ca_file
// (or the system's roots), and the gateway is known by its proof instead:
// its join-signing key, which the agent pinned at join, signs the agent's
// fresh nonce. The node proves its key over the gateway's challenge. Join
// goes over the Connect protocol on HTTP/1.1 (its answer is signed by the
// same pinned key), the session over wss://.../v1/session, renewals over
// GET /v1/challenge and POST /v1/renew. No tunnels.

// WSOptions says how to reach the gateway over the fallback.
type WSOptions struct {
	URL        string // wss://host[:port]/v1/session
	CAFile     string // PEM CAs for the proxy's certificate; empty: system roots
	SigningPin string // join_signing_key_pin
}

// WS is the fallback's client.
type WS struct {
	o    WSOptions
	hc   *http.Client
	base string // https://host[:port]
}

// wsHandshake bounds the fallback's opening: the upgrade, the gateway's
// challenge and the node's proof.
const wsHandshake = 20 * time.Second

// NewWS prepares the fallback's client: HTTP/1.1 over TLS (1.2 at least)
// checked against o.CAFile or the system's roots.
func NewWS(o WSOptions) (*WS, error) {
	u, err := url.Parse(o.URL)
	if err != nil || u.Scheme != "wss" || u.Host == "" {
		return nil, fmt.Errorf("websocket url %q is not wss://host[:port]/v1/session", o.URL)
	}
	if o.SigningPin == "" {
		return nil, errors.New("the WebSocket fallback needs join_signing_key_pin to check the gateway's proof")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}}
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("websocket ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("websocket ca_file %s holds no PEM certificate", o.CAFile)
		}
		tc.RootCAs = pool
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	tr := &http.Transport{TLSClientConfig: tc, Protocols: &protos, TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout: 90 * time.Second, Proxy: nil}
	return &WS{o: o, hc: &http.Client{Transport: tr}, base: "https://" + u.Host}, nil
}

// HTTPClient is the fallback's HTTP client.
func (w *WS) HTTPClient() *http.Client { return w.hc }

// Current returns the node's certificate and key now (they change at
// renewal).
type Current func() *tls.Certificate

// Gateway is the AgentGateway over the fallback: Join over the Connect
// protocol, Renew over POST /v1/renew with the node proof of current.
// Session and Tunnel are not for the fallback (use Dial; no tunnels).
func (w *WS) Gateway(current Current) bcdv1connect.AgentGatewayClient {
	return &wsGateway{AgentGatewayClient: bcdv1connect.NewAgentGatewayClient(w.hc, w.base, connect.WithReadMaxBytes(MaxFrame)),
		w: w, current: current}
}

type wsGateway struct {
	bcdv1connect.AgentGatewayClient
	w       *WS
	current Current
}

func nodeKey(c *tls.Certificate) (crypto.Signer, []byte, error) {
	if c == nil || len(c.Certificate) == 0 {
		return nil, nil, errors.New("no node certificate to prove")
	}
	k, ok := c.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("the node key cannot sign")
	}
	return k, c.Certificate[0], nil
}

// challenge asks the gateway for a challenge and checks its proof.
func (w *WS) challenge(ctx context.Context, nonce []byte) (wsproof.Challenge, error) {
	var c wsproof.Challenge
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.base+"/v1/challenge?nonce="+base64.RawURLEncoding.EncodeToString(nonce), nil)
	if err != nil {
		return c, err
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return c, connect.NewError(connect.CodeUnavailable, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, wsproof.MaxMessage+1))
	if err != nil {
		return c, connect.NewError(connect.CodeUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return c, httpError(resp, b)
	}
	if err := wsproof.Decode(b, &c); err != nil {
		return c, fmt.Errorf("the gateway's challenge: %w", err)
	}
	return c, wsproof.VerifyGateway(c, nonce, w.o.SigningPin)
}

func (g *wsGateway) Renew(ctx context.Context, req *connect.Request[bcdv1.RenewRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	key, cert, err := nodeKey(g.current())
	if err != nil {
		return nil, err
	}
	nonce := wsproof.NewNonce()
	c, err := g.w.challenge(ctx, nonce)
	if err != nil {
		return nil, err
	}
	body, err := proto.Marshal(req.Msg)
	if err != nil {
		return nil, err
	}
	p, err := wsproof.SignNode(key, cert, wsproof.PurposeRenew, c, nonce, body)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(wsproof.RenewBody{Nonce: nonce, Challenge: c.Challenge, Proof: p, Request: body})
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, g.w.base+"/v1/renew", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := g.w.hc.Do(hr)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, MaxFrame))
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, httpError(resp, out)
	}
	var jr bcdv1.JoinResponse
	if err := proto.Unmarshal(out, &jr); err != nil {
		return nil, fmt.Errorf("renewal answer: %w", err)
	}
	// The caller verifies the answer against the pinned join-signing key.
	return connect.NewResponse(&jr), nil
}

// httpError is a refused fallback request as an RPC error: the gateway's
// code and message when it answered, else (a proxy's own error page)
// Unavailable, which the callers retry.
func httpError(resp *http.Response, body []byte) error {
	var he wsproof.HTTPError
	var code connect.Code
	if json.Unmarshal(body, &he) != nil || code.UnmarshalText([]byte(he.Code)) != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("HTTP %d from the WebSocket fallback's host", resp.StatusCode))
	}
	err := connect.NewError(code, errors.New(he.Error))
	if v := resp.Header.Get(wsproof.PushbackHeader); v != "" {
		err.Meta().Set("grpc-retry-pushback-ms", v)
	}
	return err
}

// Dial opens a session over the fallback: the upgrade with a fresh
// nonce, the gateway's challenge and proof (checked against the pinned
// join-signing key), then the node's proof. The stream then carries the
// session's frames, one protobuf message per binary message.
func (w *WS) Dial(ctx context.Context, current Current) (*WSStream, error) {
	key, cert, err := nodeKey(current())
	if err != nil {
		return nil, err
	}
	nonce := wsproof.NewNonce()
	hctx, cancel := context.WithTimeout(ctx, wsHandshake)
	defer cancel()
	c, resp, err := websocket.Dial(hctx, w.o.URL+"?nonce="+base64.RawURLEncoding.EncodeToString(nonce),
		&websocket.DialOptions{HTTPClient: w.hc, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, wsproof.MaxMessage))
			return nil, httpError(resp, b)
		}
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	c.SetReadLimit(MaxFrame)
	fail := func(err error) (*WSStream, error) {
		c.CloseNow()
		return nil, err
	}
	typ, b, err := c.Read(hctx)
	if err != nil {
		return fail(closeError(err))
	}
	var ch wsproof.Challenge
	if typ != websocket.MessageText {
		return fail(errors.New("the gateway's challenge must be a text message"))
	}
	if err := wsproof.Decode(b, &ch); err != nil {
		return fail(fmt.Errorf("the gateway's challenge: %w", err))
	}
	if err := wsproof.VerifyGateway(ch, nonce, w.o.SigningPin); err != nil {
		return fail(err)
	}
	p, err := wsproof.SignNode(key, cert, wsproof.PurposeSession, ch, nonce, nil)
	if err != nil {
		return fail(err)
	}
	pb, _ := json.Marshal(p)
	if err := c.Write(hctx, websocket.MessageText, pb); err != nil {
		return fail(closeError(err))
	}
	sctx, stop := context.WithCancel(ctx)
	s := &WSStream{ctx: sctx, stop: stop, c: c}
	go s.ping()
	return s, nil
}

// closeError is a WebSocket read error as an RPC error: the code and
// message (and pushback) the gateway closed with, else Unavailable.
func closeError(err error) error {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	if ce.Code == websocket.StatusNormalClosure {
		return connect.NewError(connect.CodeUnavailable, errors.New("the gateway closed the session"))
	}
	code, ok := wsproof.CodeOfClose(int(ce.Code))
	if !ok {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("closed: %d %s", ce.Code, ce.Reason))
	}
	ms, msg := wsproof.ParsePushback(ce.Reason)
	e := connect.NewError(connect.Code(code), errors.New(msg))
	if ms != "" {
		e.Meta().Set("grpc-retry-pushback-ms", ms)
	}
	return e
}

// WSStream is a session's frames over the fallback.
type WSStream struct {
	ctx  context.Context
	stop context.CancelFunc
	c    *websocket.Conn
}

// ping pings the gateway every PingEvery; an answer later than 15 s ends
// the stream (HTTP/2 pings do this on the RPC).
func (s *WSStream) ping() {
	t := time.NewTicker(PingEvery)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(s.ctx, 15*time.Second)
			err := s.c.Ping(ctx)
			cancel()
			if err != nil {
				s.c.CloseNow()
				return
			}
		}
	}
}

// Send sends one frame.
func (s *WSStream) Send(f *bcdv1.AgentFrame) error {
	b, err := proto.Marshal(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	if err := s.c.Write(ctx, websocket.MessageBinary, b); err != nil {
		return closeError(err)
	}
	return nil
}

// Receive reads one frame.
func (s *WSStream) Receive() (*bcdv1.GatewayFrame, error) {
	typ, b, err := s.c.Read(s.ctx)
	if err != nil {
		return nil, closeError(err)
	}
	if typ != websocket.MessageBinary {
		return nil, errors.New("the gateway sent a text frame in the session")
	}
	var f bcdv1.GatewayFrame
	if err := proto.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("a frame from the gateway: %w", err)
	}
	return &f, nil
}

// Close ends the stream.
func (s *WSStream) Close() {
	s.stop()
	// Not Close: a gone gateway would hold the redial up for the close
	// handshake's timeout.
	_ = s.c.CloseNow()
}
