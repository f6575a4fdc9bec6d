package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
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

// ---- Session ----

// ---- Renew ----

// ---- well-known and admin ----
