package gateway_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/admin"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wellknown"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// ---- fixture ----

// lockedBuf is a log sink safe for the gateway's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// gw is a real bcgw running in-process on a loopback port.
type gw struct {
	s    *gateway.Server
	dir  string
	url  string
	pins wellknown.Pins
	jwk  *jose.JSONWebKey
	logs *lockedBuf
	// stop ends Run and returns its error; quiesce first waits (up to 1 s)
	// for sessions the test closed to end.
	stop func(quiesce bool) error

	mu  sync.Mutex
	hcs []*http.Client
}

// startGateway runs a gateway until the test ends; cfg.DataDir and
// cfg.Listen are filled in.
func startGateway(t *testing.T, cfg gateway.Config) *gw {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Listen = "127.0.0.1:0"
	logs := &lockedBuf{}
	cfg.Log = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	g := &gw{s: s, dir: cfg.DataDir, logs: logs}
	var once sync.Once
	var runErr error
	g.stop = func(quiesce bool) error {
		once.Do(func() {
			// A graceful HTTP/2 shutdown waits a second for every client
			// connection still open when it sends GOAWAY. Let the test's
			// closed sessions end and close the idle connections first.
			quiet := time.Now().Add(time.Second)
			for quiesce && g.anyConnected() && time.Now().Before(quiet) {
				time.Sleep(2 * time.Millisecond)
			}
			g.closeIdle()
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(10 * time.Second):
				runErr = errors.New("Run did not return within 10s of cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() {
		if err := g.stop(true); err != nil {
			t.Errorf("gateway Run: %v", err)
		}
	})
	// Ready once it logged that it serves (both listeners are up then).
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"bcgw serving"`) {
		select {
		case err := <-done:
			t.Fatalf("gateway Run returned early: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("gateway did not start serving within 5s")
		}
	}
	doc, err := s.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, jwk, err := wellknown.Parse(b)
	if err != nil {
		t.Fatalf("the gateway's own well-known document does not parse: %v", err)
	}
	g.url, g.pins, g.jwk = "https://"+s.Addr().String(), doc.Pins, jwk
	return g
}

// client dials the gateway over TLS pinned to its serving CA, offering cert
// for mTLS when it is not nil.
func (g *gw) client(t *testing.T, cert *tls.Certificate) bcdv1connect.AgentGatewayClient {
	t.Helper()
	cl, _ := g.clientHC(t, cert)
	return cl
}

func (g *gw) clientHC(t *testing.T, cert *tls.Certificate) (bcdv1connect.AgentGatewayClient, *http.Client) {
	t.Helper()
	o := transport.Options{URL: g.url, ServerName: "bcgw.lab", ServingCASPKIPin: g.pins.ServingCA}
	if cert != nil {
		c := *cert
		o.ClientCert = func() (*tls.Certificate, error) { return &c, nil }
	}
	cl, hc, err := transport.Client(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	g.mu.Lock()
	g.hcs = append(g.hcs, hc)
	g.mu.Unlock()
	return cl, hc
}

// anyConnected reports whether any stored node has a live session.
func (g *gw) anyConnected() bool {
	nodes, _ := g.s.Store().Nodes()
	for _, n := range nodes {
		if g.s.Connected(n.ID) {
			return true
		}
	}
	return false
}

// closeIdle closes the idle connections of every client made so far, so
// that a graceful shutdown need not wait for them.
func (g *gw) closeIdle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, hc := range g.hcs {
		hc.CloseIdleConnections()
	}
}

func (g *gw) token(t *testing.T, role string, uses int) string {
	t.Helper()
	tok, _, err := g.s.NewToken(role, "lab", uses, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func joinOpts(g *gw, cl bcdv1connect.AgentGatewayClient, tok, dir string) join.Options {
	return join.Options{
		Client: cl, Role: "node", Token: tok, EncryptionJWK: g.jwk, SigningPin: g.pins.JoinSigning,
		Claims: &bcdv1.HardwareClaims{Hostname: "host-under-test"}, DataDir: dir, MaxAttempts: 1,
	}
}

// join joins a new node with a fresh one-use token.
func (g *gw) join(t *testing.T) *identity.Agent {
	t.Helper()
	a, err := join.Join(context.Background(), joinOpts(g, g.client(t, nil), g.token(t, "node", 1), t.TempDir()))
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	return a
}

func certOf(a *identity.Agent) *tls.Certificate {
	c := a.TLSCertificate()
	return &c
}

// joinRequest builds a JoinRequest by hand: the token sealed to jwk, bound
// to bindCSR, with a CSR for a new key.
func joinRequest(t *testing.T, jwk *jose.JSONWebKey, tok, role string, bindCSR []byte, issued time.Time) (*bcdv1.JoinRequest, []byte) {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key, "raw-join")
	if err != nil {
		t.Fatal(err)
	}
	if bindCSR == nil {
		bindCSR = csr
	}
	sum := sha256.Sum256(bindCSR)
	sealed, err := pki.SealToken(jwk, pki.SealedToken{Token: tok, CSRSHA256: fmt.Sprintf("%x", sum), IssuedAt: issued.Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return &bcdv1.JoinRequest{Role: role, SealedToken: sealed, Csr: csr}, csr
}

func otherCSR(t *testing.T) []byte {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(k, "other")
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func secretOf(tok string) string { return tok[strings.LastIndex(tok, "_")+1:] }

// openSession opens a Session stream, sends Hello for nodeID and returns
// the stream with the first frame or the error the gateway ended it with.
// The stream is closed when the test ends, before the gateway stops.
func openSession(t *testing.T, ctx context.Context, cl bcdv1connect.AgentGatewayClient, nodeID string) (*connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame], *bcdv1.GatewayFrame, error) {
	st := cl.Session(ctx)
	t.Cleanup(func() {
		_ = st.CloseRequest()
		_ = st.CloseResponse()
	})
	err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: nodeID, Role: "node", BootId: "boot"}}})
	if err != nil && !errors.Is(err, io.EOF) {
		return st, nil, err
	}
	f, err := st.Receive()
	return st, f, err
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ---- Join ----

func TestJoinStoresNode(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	dir := t.TempDir()
	a, err := join.Join(context.Background(), joinOpts(g, g.client(t, nil), g.token(t, "node", 1), dir))
	if err != nil {
		t.Fatal(err)
	}
	n, err := g.s.Store().Node(a.NodeID)
	if err != nil {
		t.Fatalf("joined node %s is not stored: %v", a.NodeID, err)
	}
	if n.Role != "node" || n.Site != "lab" || n.Hostname != "host-under-test" {
		t.Errorf("stored node %+v, want role node, site lab, hostname host-under-test", n)
	}
	if n.CertSerial != a.Cert.SerialNumber.Text(16) || n.SPIFFEID != a.SPIFFEID {
		t.Errorf("stored serial/spiffe %s %s, agent has %s %s", n.CertSerial, n.SPIFFEID, a.Cert.SerialNumber.Text(16), a.SPIFFEID)
	}
	if want := "spiffe://bcgw.lab/node/" + a.NodeID; a.SPIFFEID != want {
		t.Errorf("SPIFFE id %s, want %s", a.SPIFFEID, want)
	}
	loaded, err := identity.Load(dir)
	if err != nil || loaded.NodeID != a.NodeID {
		t.Fatalf("identity in data dir: %v %+v", err, loaded)
	}
}

func TestJoinTokenUsesAreCounted(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	cl := g.client(t, nil)
	tok := g.token(t, "node", 1)
	if _, err := join.Join(context.Background(), joinOpts(g, cl, tok, t.TempDir())); err != nil {
		t.Fatalf("first join: %v", err)
	}
	// The raw RPC says why.
	req, _ := joinRequest(t, g.jwk, tok, "node", nil, time.Now())
	_, err := cl.Join(context.Background(), connect.NewRequest(req))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("second use of a one-use token: %v, want PermissionDenied", err)
	}
	// The join client reports a refusal and stores nothing.
	dir := t.TempDir()
	_, err = join.Join(context.Background(), joinOpts(g, cl, tok, dir))
	if err == nil || !strings.HasPrefix(err.Error(), "Join refused: ") {
		t.Fatalf("join.Join with a spent token: %v, want Join refused", err)
	}
	if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("refused join left an identity: %v", err)
	}
	nodes, err := g.s.Store().Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("%d nodes stored, want 1 (the refused joins must add none)", len(nodes))
	}
}

// TestJoinRefusals: every refusal has the right code, adds no node, and
// neither its message nor the gateway's log holds the token or its secret.
func TestJoinRefusals(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	cl := g.client(t, nil)

	// A second gateway, with keys of its own.
	other, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", URL: "https://other.invalid:443"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Store().Close() })
	odoc, err := other.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	ob, _ := json.Marshal(odoc)
	_, otherJWK, err := wellknown.Parse(ob)
	if err != nil {
		t.Fatal(err)
	}
	if odoc.Pins.JoinEncryption == g.pins.JoinEncryption {
		t.Fatal("two gateways share a join encryption key")
	}

	var tokens []string
	tok := func(role string, uses int, ttl time.Duration) string {
		tk, _, err := g.s.NewToken(role, "lab", uses, ttl)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tk)
		return tk
	}
	siteTok := tok("site", 1, 0)
	nodeTok := tok("node", 5, 0)
	expired := tok("node", 1, time.Nanosecond)
	wrongSecret := nodeTok[:strings.LastIndex(nodeTok, "_")+1] + strings.Repeat("a", len(secretOf(nodeTok)))
	tokens = append(tokens, wrongSecret)

	tests := []struct {
		name string
		req  func() *bcdv1.JoinRequest
		code connect.Code
	}{
		{"role not allowed by token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, siteTok, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed token bound to another CSR", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", otherCSR(t), time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed for another gateway's key", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, otherJWK, nodeTok, "node", nil, time.Now())
			return r
		}, connect.CodeInvalidArgument},
		{"wrong secret", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, wrongSecret, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"expired token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, expired, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed an hour ago", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now().Add(-time.Hour))
			return r
		}, connect.CodePermissionDenied},
		{"not a bcjt token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, "notatoken", "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"role neither node nor site", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "admin", nil, time.Now())
			return r
		}, connect.CodeInvalidArgument},
		{"unsupported attestor", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now())
			r.Attestor = "cloud-iid"
			return r
		}, connect.CodeUnimplemented},
		{"garbage CSR", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now())
			r.Csr = []byte("not a csr")
			return r
		}, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := cl.Join(context.Background(), connect.NewRequest(tt.req()))
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want code %v", err, tt.code)
			}
			for _, tk := range tokens {
				if strings.Contains(err.Error(), tk) || strings.Contains(err.Error(), secretOf(tk)) {
					t.Errorf("error %q holds a token or its secret", err)
				}
			}
		})
	}
	nodes, err := g.s.Store().Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 0 {
		t.Fatalf("refused joins stored %d nodes", len(nodes))
	}
	// The site token was not used up by the refused node join.
	r, _ := joinRequest(t, g.jwk, siteTok, "site", nil, time.Now())
	if _, err := cl.Join(context.Background(), connect.NewRequest(r)); err != nil {
		t.Fatalf("site join with the site token after a refused node join: %v", err)
	}
	logs := g.logs.String()
	if !strings.Contains(logs, "join refused") {
		t.Fatalf("the gateway logged no refusal; log:\n%s", logs)
	}
	for _, tk := range tokens {
		if strings.Contains(logs, tk) || strings.Contains(logs, secretOf(tk)) {
			t.Errorf("the gateway log holds a token or its secret:\n%s", logs)
		}
	}
}

// ---- Session ----

func TestSessionBusyCarriesPushback(t *testing.T) {
	const pushback = 1234 * time.Millisecond
	g := startGateway(t, gateway.Config{MaxSessions: 1, Pushback: pushback})
	a, b := g.join(t), g.join(t)

	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	stA, f, err := openSession(t, ctxA, g.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("first session: %v, first frame %v", err, f)
	}
	clB := g.client(t, certOf(b))
	_, _, err = openSession(t, context.Background(), clB, b.NodeID)
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("second session: %v, want ResourceExhausted", err)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("%T is not a connect error", err)
	}
	if got := ce.Meta().Get("grpc-retry-pushback-ms"); got != "1234" {
		t.Errorf("grpc-retry-pushback-ms = %q, want 1234", got)
	}
	if d, ok := backoff.Pushback(err); !ok || d != pushback {
		t.Errorf("join.Pushback = %v %v, want %v", d, ok, pushback)
	}

	// Once the first session ends, the second node gets in.
	cancelA()
	_ = stA.CloseRequest()
	_ = stA.CloseResponse()
	waitFor(t, "the first session to end", func() bool { return !g.s.Connected(a.NodeID) })
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	if _, f, err := openSession(t, ctxB, clB, b.NodeID); err != nil || f.GetWelcome() == nil {
		t.Fatalf("second node after the first left: %v, %v", err, f)
	}
}

func TestSessionLimitHoldsForConcurrentDials(t *testing.T) {
	g := startGateway(t, gateway.Config{MaxSessions: 1, Pushback: 50 * time.Millisecond})
	a, b := g.join(t), g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []*connect.BidiStreamForClient[bcdv1.AgentFrame, bcdv1.GatewayFrame]
	for _, n := range []*identity.Agent{a, b} {
		st := g.client(t, certOf(n)).Session(ctx)
		t.Cleanup(func() { _ = st.CloseRequest(); _ = st.CloseResponse() })
		// Headers only: the handler runs its checks and waits for Hello.
		if err := st.Send(nil); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	// Nothing the gateway exposes says a handler is waiting for Hello;
	// give both a moment to get there.
	time.Sleep(100 * time.Millisecond)
	welcomed := 0
	for i, n := range []*identity.Agent{a, b} {
		_ = streams[i].Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: n.NodeID}}})
		f, err := streams[i].Receive()
		if err == nil && f.GetWelcome() != nil {
			welcomed++
		}
	}
	if welcomed > 1 || (g.s.Connected(a.NodeID) && g.s.Connected(b.NodeID)) {
		t.Fatalf("%d sessions welcomed with MaxSessions=1", welcomed)
	}
}

func TestSessionAuthentication(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	tests := []struct {
		name  string
		cert  *tls.Certificate
		hello string
		code  connect.Code
	}{
		{"no client certificate", nil, a.NodeID, connect.CodeUnauthenticated},
		{"Hello names another node", certOf(a), "node_someoneelse", connect.CodePermissionDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, f, err := openSession(t, context.Background(), g.client(t, tt.cert), tt.hello)
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v (first frame %v), want %v", err, f, tt.code)
			}
		})
	}
	if g.s.Connected(a.NodeID) {
		t.Error("a refused session is registered as connected")
	}
}

func TestSessionCommandRoundTrip(t *testing.T) {
	g := startGateway(t, gateway.Config{Heartbeat: 7 * time.Second})
	a := g.join(t)
	// One command waits from before the session: it is sent after Welcome.
	early, err := g.s.SendCommand(a.NodeID, "k.early", []byte(`{"n":1}`), 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	w := f.GetWelcome()
	if w == nil || w.GetEpoch() != 1 || w.GetHeartbeatSeconds() != 7 {
		t.Fatalf("first frame %v, want Welcome epoch 1 heartbeat 7", f)
	}
	if d := time.Since(time.UnixMilli(w.GetServerTimeUnixMs())); d < -time.Minute || d > time.Minute {
		t.Errorf("Welcome server time is %v off", d)
	}
	f, err = st.Receive()
	if err != nil || f.GetCommand().GetId() != early.ID {
		t.Fatalf("after Welcome: %v %v, want the pending command %s", f, err, early.ID)
	}
	if c := f.GetCommand(); c.GetNodeId() != a.NodeID || c.GetKind() != "k.early" || string(c.GetBody()) != `{"n":1}` ||
		c.GetDeadlineUnixMs() < time.Now().Add(9*time.Minute).UnixMilli() {
		t.Errorf("command frame %v", c)
	}
	waitFor(t, "the session to register", func() bool { return g.s.Connected(a.NodeID) })
	live, err := g.s.SendCommand(a.NodeID, "k.live", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if f, err = st.Receive(); err != nil || f.GetCommand().GetId() != live.ID {
		t.Fatalf("live command: %v %v", f, err)
	}
	// Ack receipt of both, then a result for the first (twice: once stored).
	send := func(f *bcdv1.AgentFrame) {
		t.Helper()
		if err := st.Send(f); err != nil {
			t.Fatal(err)
		}
	}
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Ack{Ack: &bcdv1.Ack{CommandIds: []string{early.ID, live.ID}}}})
	for _, out := range []string{`{"ok":true}`, `{"ok":"again"}`} {
		send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: early.ID, Status: "SUCCEEDED", Output: []byte(out)}}})
		f, err = st.Receive()
		if err != nil || len(f.GetAck().GetResultIds()) != 1 || f.GetAck().GetResultIds()[0] != early.ID {
			t.Fatalf("after a result: %v %v, want an Ack for %s", f, err, early.ID)
		}
	}
	c, err := g.s.Store().Command(early.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.StateDone || c.Result == nil || string(c.Result.Output) != `{"ok":true}` {
		t.Errorf("stored command %+v result %+v, want done with the first output", c, c.Result)
	}
	waitFor(t, "the ack of the live command", func() bool {
		c, err := g.s.Store().Command(live.ID)
		return err == nil && c.State == store.StateDelivered
	})
	un, err := g.s.Store().Unfinished(a.NodeID)
	if err != nil || len(un) != 1 || un[0].ID != live.ID {
		t.Errorf("unfinished %v %v, want only %s", un, err, live.ID)
	}
	// A result for a command the gateway does not know is acked, so the
	// agent stops re-sending it, and stored nowhere.
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Result{Result: &bcdv1.CommandResult{CommandId: "cmd_unknown", Status: "SUCCEEDED"}}})
	if f, err = st.Receive(); err != nil || !slices.Equal(f.GetAck().GetResultIds(), []string{"cmd_unknown"}) {
		t.Fatalf("after a result for an unknown command: %v %v, want its ack", f, err)
	}
	if _, err := g.s.Store().Command("cmd_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown command's result stored: %v", err)
	}
	// A second Hello on the same stream ends it.
	send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Hello{Hello: &bcdv1.Hello{NodeId: a.NodeID}}})
	if _, err := st.Receive(); err == nil {
		t.Error("the stream went on after a second Hello")
	}
}

func TestSessionRevocation(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	cl := g.client(t, certOf(a))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, cl, a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session: %v %v", err, f)
	}
	if err := g.s.Revoke(a.NodeID); err != nil {
		t.Fatal(err)
	}
	// The live session is told, then ended.
	f, err = st.Receive()
	if err != nil || f.GetRevocation() == nil {
		t.Fatalf("live session after Revoke: %v %v, want RevocationNotice", f, err)
	}
	if f, err := st.Receive(); err == nil {
		t.Fatalf("live session went on after RevocationNotice: %v", f)
	}
	// A new session is told at once.
	_, f, err = openSession(t, context.Background(), cl, a.NodeID)
	if err != nil || f.GetRevocation() == nil {
		t.Fatalf("revoked node's new session: first frame %v, err %v, want RevocationNotice", f, err)
	}
	if g.s.Connected(a.NodeID) {
		t.Error("revoked node is connected")
	}
	if _, err := g.s.SendCommand(a.NodeID, "k", nil, 0); err == nil {
		t.Error("a command was stored for a revoked node")
	}
	if un, _ := g.s.Store().Unfinished(a.NodeID); len(un) != 0 {
		t.Errorf("revoked node has commands %v", un)
	}
	if err := g.s.Revoke("node_unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Revoke of an unknown node: %v, want ErrNotFound", err)
	}
	// Renew is refused too.
	k, _ := pki.GenerateKey()
	csr, _ := pki.CreateCSR(k, "x")
	proof, _ := pki.Sign(a.Key, pki.PurposeRenew, csr)
	_, err = cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("Renew of a revoked node: %v, want PermissionDenied", err)
	}
}

func TestShutdownDrainsSessions(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, f, err := openSession(t, ctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session: %v %v", err, f)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- g.stop(false) }()
	f, err = st.Receive()
	if err != nil || f.GetDrain() == nil {
		t.Fatalf("frame at shutdown %v, %v, want Drain", f, err)
	}
	if f.GetDrain().GetRedialAfterMs() == 0 {
		t.Error("Drain asks for no redial delay")
	}
	_ = st.CloseRequest()
	_ = st.CloseResponse()
	g.closeIdle()
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// ---- Renew ----

func TestRenew(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	cl := g.client(t, certOf(a))
	newKey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(newKey, "renewed")
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := pki.GenerateKey()
	mustSign := func(purpose string, signer *identity.Agent, useStranger bool) []byte {
		t.Helper()
		var sig []byte
		var err error
		if useStranger {
			sig, err = pki.Sign(stranger, purpose, csr)
		} else {
			sig, err = pki.Sign(signer.Key, purpose, csr)
		}
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	// Refusals first: the good case supersedes the certificate.
	refusals := []struct {
		name   string
		client bcdv1connect.AgentGatewayClient
		proof  []byte
		csr    []byte
		code   connect.Code
	}{
		{"proof made for the join-response purpose", cl, mustSign(pki.PurposeJoinResponse, a, false), csr, connect.CodePermissionDenied},
		{"proof by another key", cl, mustSign(pki.PurposeRenew, a, true), csr, connect.CodePermissionDenied},
		{"proof over another CSR", cl, mustSign(pki.PurposeRenew, a, false), otherCSR(t), connect.CodePermissionDenied},
		{"no client certificate", g.client(t, nil), mustSign(pki.PurposeRenew, a, false), csr, connect.CodeUnauthenticated},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.client.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: tt.csr, Proof: tt.proof}))
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want %v", err, tt.code)
			}
		})
	}
	n, _ := g.s.Store().Node(a.NodeID)
	if n.CertSerial != a.Cert.SerialNumber.Text(16) {
		t.Fatal("a refused renewal changed the node's certificate serial")
	}

	resp, err := cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: mustSign(pki.PurposeRenew, a, false)}))
	if err != nil {
		t.Fatalf("Renew with a valid proof: %v", err)
	}
	res, cert, err := join.VerifyResponse(resp.Msg, g.pins.JoinSigning, csr, newKey.Public(), "node")
	if err != nil {
		t.Fatalf("renewal response does not verify: %v", err)
	}
	if res.GetNodeId() != a.NodeID || !newKey.PublicKey.Equal(cert.PublicKey) {
		t.Fatalf("renewed certificate: node %s, want %s and the new key", res.GetNodeId(), a.NodeID)
	}
	n, _ = g.s.Store().Node(a.NodeID)
	if n.CertSerial != cert.SerialNumber.Text(16) {
		t.Errorf("stored serial %s, want the renewed %s", n.CertSerial, cert.SerialNumber.Text(16))
	}
	// The new certificate opens a session; the old one is superseded.
	renewed, err := identity.Save(t.TempDir(), newKey, cert, a.Identity)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, f, err := openSession(t, ctx, g.client(t, certOf(renewed)), a.NodeID); err != nil || f.GetWelcome() == nil {
		t.Fatalf("session with the renewed certificate: %v %v", err, f)
	}
	if _, _, err := openSession(t, context.Background(), g.client(t, certOf(a)), a.NodeID); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("session with the superseded certificate: %v, want Unauthenticated", err)
	}
}

// ---- well-known and admin ----

func TestWellKnownServed(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	doc, jwk, err := wellknown.Fetch(context.Background(), g.url, g.pins.ServingCA)
	if err != nil {
		t.Fatalf("fetch over pinned TLS: %v", err)
	}
	want, _ := g.s.WellKnown()
	if doc.Pins != want.Pins || doc.Gateway != want.Gateway || doc.Gateway.URL != g.url {
		t.Errorf("fetched %+v, want %+v", doc, want)
	}
	if pin, _ := pki.JWKPin(jwk); pin != g.pins.JoinEncryption {
		t.Error("fetched encryption key does not match its pin")
	}
	// Another serving CA pin is refused.
	otherCA, _ := pki.NewCA("other", time.Hour)
	if _, _, err := wellknown.Fetch(context.Background(), g.url, pki.PinOfCert(otherCA.Cert)); err == nil {
		t.Error("fetch with another serving CA pin succeeded")
	}
}

func TestWellKnownBeforeRun(t *testing.T) {
	s, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Store().Close()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("WellKnown before Run panicked: %v", r)
		}
	}()
	_, _ = s.WellKnown()
}

func TestAdminAPI(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	st, err := os.Stat(filepath.Join(g.dir, adminapi.AdminSocket))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("admin socket mode %v, want a socket with 0600", st.Mode())
	}
	ctx := context.Background()
	ac := adminapi.NewClient(g.dir, "", "")

	if _, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "admin", Uses: 1}); err == nil {
		t.Error("token for role admin was created")
	}
	if _, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "node", Uses: 0}); err == nil {
		t.Error("token with 0 uses was created")
	}
	tr, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "node", Site: "fsn1", Uses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tr.Token, "bcjt_"+tr.ID+"_") || tr.ExpiresAt.IsZero() {
		t.Fatalf("token response %+v", tr)
	}
	a, err := join.Join(ctx, joinOpts(g, g.client(t, nil), tr.Token, t.TempDir()))
	if err != nil {
		t.Fatalf("join with the admin-created token: %v", err)
	}
	nodes, err := ac.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].ID != a.NodeID || nodes[0].Site != "fsn1" || nodes[0].Connected || nodes[0].Revoked {
		t.Fatalf("nodes %+v, want the one joined node, site fsn1, not connected", nodes)
	}
	if _, err := ac.Send(ctx, adminapi.CommandRequest{Node: "node_nosuch", Kind: "agent.ping"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("send to an unknown node: %v, want not found", err)
	}
	if _, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping", Body: json.RawMessage(`{"x":1}`), DeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	cv, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping"})
	if err != nil {
		t.Fatal(err)
	}
	if cv.State != store.StatePending || cv.Node != a.NodeID || cv.Kind != "agent.ping" {
		t.Errorf("sent command view %+v", cv)
	}
	got, err := ac.Command(ctx, cv.ID, 0)
	if err != nil || got.ID != cv.ID || got.State != store.StatePending {
		t.Errorf("command %+v %v", got, err)
	}
	if _, err := ac.Command(ctx, "cmd_nosuch", 0); err == nil {
		t.Error("unknown command read without error")
	}
	if err := ac.Revoke(ctx, "node_nosuch"); err == nil {
		t.Error("revoke of an unknown node succeeded")
	}
	if err := ac.Revoke(ctx, a.NodeID); err != nil {
		t.Fatal(err)
	}
	nodes, _ = ac.Nodes(ctx)
	if len(nodes) != 1 || !nodes[0].Revoked {
		t.Errorf("after revoke: %+v", nodes)
	}
	var doc wellknown.Document
	if err := ac.WellKnown(ctx, &doc); err != nil || doc.Pins != g.pins {
		t.Errorf("admin well-known %+v %v", doc, err)
	}
	if strings.Contains(g.logs.String(), secretOf(tr.Token)) {
		t.Error("the gateway log holds the admin-created token's secret")
	}
}

func TestAdminLoopbackNeedsBearer(t *testing.T) {
	g := startGateway(t, gateway.Config{AdminListen: "127.0.0.1:0"})
	url := g.s.AdminURL()
	if url == "" {
		t.Fatal("no admin URL")
	}
	b, err := os.ReadFile(filepath.Join(g.dir, adminapi.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(g.dir, adminapi.AdminTokenFile)); st.Mode().Perm() != 0o600 {
		t.Errorf("admin token file mode %v, want 0600", st.Mode().Perm())
	}
	bearer := strings.TrimSpace(string(b))
	tests := []struct {
		name   string
		bearer string
		ok     bool
	}{
		{"no bearer", "", false},
		{"wrong bearer", bearer + "x", false},
		{"right bearer", bearer, true},
	}
	for _, tt := range tests {
		_, err := adminapi.NewClient("", url, tt.bearer).Nodes(context.Background())
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	// The token alone, or under another scheme, is not a bearer token.
	for _, header := range []string{bearer, "bearer " + bearer, "Basic " + bearer, "Bearer  " + bearer, "Bearer " + bearer} {
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/nodes", nil)
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusUnauthorized
		if header == "Bearer "+bearer {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: %d, want %d", strings.Replace(header, bearer, "TOKEN", 1), resp.StatusCode, want)
		}
	}
}

// TestAdminSocketPrivateUnderAnyUmask: under umask 000, with a data
// directory that exists open to all, bcgw tightens the directory to 0700
// and its admin socket is never seen with a mode wider than 0600: not at
// its path (watched from before bcgw starts), and not where it is bound.
func TestAdminSocketPrivateUnderAnyUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, adminapi.AdminSocket)
	var mu sync.Mutex
	var seen []string
	note := func(where string, mode os.FileMode) {
		if mode.Perm()&^0o600 != 0 {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s: %v", where, mode))
			mu.Unlock()
		}
	}
	// Watch the socket's path as fast as the machine lets us until bcgw
	// serves; every mode seen must be 0600 or narrower.
	stop := make(chan struct{})
	watched := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				watched <- n
				return
			default:
			}
			if st, err := os.Lstat(sock); err == nil {
				note("at its path", st.Mode())
				n++
			}
		}
	}()
	cfg := gateway.WithBoundAside(gateway.Config{DataDir: dir}, func(first string) {
		st, err := os.Lstat(first)
		if err != nil {
			t.Errorf("bound socket: %v", err)
			return
		}
		if pst, err := os.Stat(filepath.Dir(first)); err != nil || pst.Mode().Perm() != 0o700 {
			t.Errorf("the socket is bound in %s, not a 0700 directory (%v)", filepath.Dir(first), err)
		}
		if _, err := os.Lstat(sock); err == nil {
			t.Errorf("%s exists before its socket has its mode", sock)
		}
		_ = st // bound under umask 000: wide, but in a 0700 directory no one else can enter
	})
	g := startGateway(t, cfg)
	close(stop)
	if n := <-watched; n == 0 {
		t.Log("the watcher never saw the socket before bcgw served (it checks again below)")
	}
	st, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	note("once serving", st.Mode())
	if st.Mode()&os.ModeSocket == 0 {
		t.Errorf("%s is %v, not a socket", sock, st.Mode())
	}
	if dst, _ := os.Stat(dir); dst.Mode().Perm() != 0o700 {
		t.Errorf("data directory mode %v, want 0700", dst.Mode().Perm())
	}
	if _, err := adminapi.NewClient(g.dir, "", "").Nodes(context.Background()); err != nil {
		t.Errorf("the renamed socket does not serve: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		t.Errorf("admin socket wider than 0600 %s", s)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".bind-") {
				t.Errorf("the bind directory %s is left behind", e.Name())
			}
		}
	}
}

// TestAdminSocketRemovedOnClose: the socket file goes with its listener.
func TestAdminSocketRemovedOnClose(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	l, err := admin.ListenPrivate(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", st, err)
	}
	l.Close()
	if _, err := os.Lstat(sock); err == nil {
		t.Error("the socket file outlives its listener")
	}
}

func TestRunRefusesNonLoopbackAdmin(t *testing.T) {
	s, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminListen: "0.0.0.0:0"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("Run with --admin-listen 0.0.0.0: %v, want a loopback error", err)
	}
}
