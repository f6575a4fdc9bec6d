package tunnel_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/trust/ticket"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// gateway is a Tunnel server that reports each stream's first frame and
// echoes nothing; an accepted tunnel's stream is handed to the test.
type gateway struct {
	bcdv1connect.UnimplementedAgentGatewayHandler
	first chan *bcdv1.TunnelData
}

func (g *gateway) Tunnel(ctx context.Context, st *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]) error {
	f, err := st.Receive()
	if err != nil {
		return err
	}
	g.first <- f
	if f.GetError() != "" {
		return nil
	}
	for {
		if _, err := st.Receive(); err != nil {
			return nil
		}
	}
}

func startGateway(t *testing.T) (*gateway, bcdv1connect.AgentGatewayClient) {
	g := &gateway{first: make(chan *bcdv1.TunnelData, 64)}
	_, c := startGatewayWith(t, g)
	return g, c
}

func startGatewayWith(t *testing.T, g bcdv1connect.AgentGatewayHandler) (*httptest.Server, bcdv1connect.AgentGatewayClient) {
	mux := http.NewServeMux()
	mux.Handle(bcdv1connect.NewAgentGatewayHandler(g))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{Protocols: p}}
	return srv, bcdv1connect.NewAgentGatewayClient(hc, srv.URL, connect.WithGRPC())
}

// target is a loopback listener counting the connections it accepted.
type target struct {
	l        net.Listener
	mu       sync.Mutex
	accepted int
}

func listen(t *testing.T) *target {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tg := &target{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tg.mu.Lock()
			tg.accepted++
			tg.mu.Unlock()
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	return tg
}

func (tg *target) port() int { return tg.l.Addr().(*net.TCPAddr).Port }
func (tg *target) count() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.accepted
}

type events struct {
	mu  sync.Mutex
	all []string
}

func (e *events) add(typ string, body any) {
	b, _ := json.Marshal(body)
	e.mu.Lock()
	e.all = append(e.all, typ+" "+string(b))
	e.mu.Unlock()
}

func jwksOf(k *ecdsa.PrivateKey, kid string) *jose.JSONWebKeySet {
	return &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: kid, Algorithm: "ES256"}}}
}

func newManager(t *testing.T, dir string, client bcdv1connect.AgentGatewayClient, jwks *jose.JSONWebKeySet, ev *events) *tunnel.Manager {
	m := tunnel.New(tunnel.Config{NodeID: "node-1", DataDir: dir, Client: client,
		JWKS: func() *jose.JSONWebKeySet { return jwks }, Now: time.Now,
		Epoch: func() (bool, uint64) { return true, 1 }, Event: ev.add})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go m.Run(ctx)
	return m
}

func sign(t *testing.T, k *ecdsa.PrivateKey, kid string, f func(*ticket.Claims)) (string, ticket.Claims) {
	now := time.Now()
	c := ticket.Claims{Node: "node-1", Kind: "tcp:1", Account: "alice", JTI: tunnel.NewID(), Issued: now, Expiry: now.Add(time.Minute)}
	f(&c)
	s, err := ticket.Sign(k, kid, c)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func first(t *testing.T, g *gateway) *bcdv1.TunnelData {
	select {
	case f := <-g.first:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no Tunnel stream within 10 s")
		return nil
	}
}

// TestTicketRefusals: a ticket for another node, an expired one, one
// signed by a key outside the JWKS, one for another kind than asked, and a
// ticket used twice (also by a restarted agent) are each refused: the
// gateway hears why, no target is dialled, no tunnel is listed.
func TestTicketRefusals(t *testing.T) {
	g, client := startGateway(t)
	tg := listen(t)
	k, other := mustKey(t), mustKey(t)
	jwks := jwksOf(k, "k1")
	dir := t.TempDir()
	ev := &events{}
	m := newManager(t, dir, client, jwks, ev)
	kind := ticket.TCP(tg.port())
	good, _ := sign(t, k, "k1", func(c *ticket.Claims) { c.Kind = kind })

	m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t-good", Target: kind, Ticket: good})
	if f := first(t, g); f.GetError() != "" || f.GetTunnelId() != "t-good" {
		t.Fatalf("a good ticket: first frame %+v", f)
	}
	waitFor(t, func() bool { return tg.count() == 1 })

	expiredTok, _ := sign(t, k, "k1", func(c *ticket.Claims) {
		c.Kind, c.Issued, c.Expiry = kind, time.Now().Add(-2*time.Minute), time.Now().Add(-time.Minute)
	})
	otherNode, _ := sign(t, k, "k1", func(c *ticket.Claims) { c.Kind, c.Node = kind, "node-2" })
	outside, _ := sign(t, other, "k1", func(c *ticket.Claims) { c.Kind = kind })
	console, _ := sign(t, k, "k1", func(c *ticket.Claims) { c.Kind = "console" })
	for name, ot := range map[string]*bcdv1.OpenTunnel{
		"used twice":              {TunnelId: "t-again", Target: kind, Ticket: good},
		"expired":                 {TunnelId: "t-exp", Target: kind, Ticket: expiredTok},
		"for another node":        {TunnelId: "t-node", Target: kind, Ticket: otherNode},
		"a key outside the JWKS":  {TunnelId: "t-key", Target: kind, Ticket: outside},
		"another kind than asked": {TunnelId: "t-kind", Target: kind, Ticket: console},
	} {
		t.Run(name, func(t *testing.T) {
			m.Open(context.Background(), ot)
			f := first(t, g)
			if f.GetError() == "" || !f.GetClose() || f.GetTunnelId() != ot.TunnelId {
				t.Fatalf("first frame %+v, want a refusal", f)
			}
		})
	}
	if n := tg.count(); n != 1 {
		t.Fatalf("refused tickets dialled the target: %d connections", n)
	}
	// A restarted agent (a new manager over the same data_dir) still
	// refuses the spent ticket.
	m2 := newManager(t, dir, client, jwks, ev)
	m2.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t-restart", Target: kind, Ticket: good})
	if f := first(t, g); !strings.Contains(f.GetError(), "already used") {
		t.Fatalf("after a restart: %+v", f)
	}
	if n := tg.count(); n != 1 || len(m2.List()) != 0 {
		t.Fatalf("after a restart: %d connections, %d tunnels", n, len(m2.List()))
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	refused := 0
	for _, e := range ev.all {
		if strings.HasPrefix(e, "tunnel.refused ") {
			refused++
		}
	}
	if refused != 6 || !strings.HasPrefix(ev.all[0], "tunnel.opened ") || !strings.Contains(ev.all[0], `"account":"alice"`) {
		t.Fatalf("events %v", ev.all)
	}
}

// TestNoJWKS: a node whose access section holds no JWKS refuses every
// ticket.
func TestNoJWKS(t *testing.T) {
	g, client := startGateway(t)
	k := mustKey(t)
	m := newManager(t, t.TempDir(), client, nil, &events{})
	tok, _ := sign(t, k, "k1", func(*ticket.Claims) {})
	m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t", Target: "tcp:1", Ticket: tok})
	if f := first(t, g); !strings.Contains(f.GetError(), "no exec-ticket JWKS") {
		t.Fatalf("first frame %+v", f)
	}
}

// TestAtMost16: 16 tunnels open at once, the 17th is refused; once one
// closes (its ticket expired) another opens.
func TestAtMost16(t *testing.T) {
	g, client := startGateway(t)
	tg := listen(t)
	k := mustKey(t)
	m := newManager(t, t.TempDir(), client, jwksOf(k, "k1"), &events{})
	kind := ticket.TCP(tg.port())
	for i := 0; i < tunnel.MaxOpen; i++ {
		tok, _ := sign(t, k, "k1", func(c *ticket.Claims) {
			c.Kind = kind
			if i == 0 {
				c.Expiry = time.Now().Add(2 * time.Second)
			}
		})
		m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t" + string(rune('a'+i)), Target: kind, Ticket: tok})
		if f := first(t, g); f.GetError() != "" {
			t.Fatalf("tunnel %d: %s", i, f.GetError())
		}
	}
	waitFor(t, func() bool { return len(m.List()) == tunnel.MaxOpen })
	tok, _ := sign(t, k, "k1", func(c *ticket.Claims) { c.Kind = kind })
	m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t17", Target: kind, Ticket: tok})
	if f := first(t, g); !strings.Contains(f.GetError(), "16 tunnels are open") {
		t.Fatalf("the 17th: %+v", f)
	}
	// The first one's ticket expires: it closes, and a new one opens.
	waitFor(t, func() bool { return len(m.List()) == tunnel.MaxOpen-1 })
	tok, _ = sign(t, k, "k1", func(c *ticket.Claims) { c.Kind = kind })
	m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: "t18", Target: kind, Ticket: tok})
	if f := first(t, g); f.GetError() != "" {
		t.Fatalf("after one closed: %s", f.GetError())
	}
}

func FuzzSpentFile(f *testing.F) {
	f.Add([]byte(`{"v":1,"spent":{"abc":1}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := writeFile(dir+"/"+tunnel.SpentFile, data); err != nil {
			return
		}
		s := tunnel.OpenSpent(dir)
		err := s.Spend("jti-0123456789abcdef", time.Now().Add(time.Minute), time.Now())
		if err == nil {
			if err := s.Spend("jti-0123456789abcdef", time.Now().Add(time.Minute), time.Now()); !errors.Is(err, tunnel.ErrSpent) {
				t.Fatalf("spent twice: %v", err)
			}
		}
	})
}

func mustKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func waitFor(t *testing.T, f func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if f() {
			return
		}
	}
	t.Fatal("condition not met within 10 s")
}

// TestClosedOnSessionLossAndJWKSChange: an open tunnel closes when the
// session it came in ends, and when its ticket's key leaves the JWKS.
func TestClosedOnSessionLossAndJWKSChange(t *testing.T) {
	g, client := startGateway(t)
	tg := listen(t)
	k := mustKey(t)
	var epoch atomic.Uint64
	epoch.Store(1)
	var jwks atomic.Pointer[jose.JSONWebKeySet]
	jwks.Store(jwksOf(k, "k1"))
	ev := &events{}
	m := tunnel.New(tunnel.Config{NodeID: "node-1", DataDir: t.TempDir(), Client: client,
		JWKS: jwks.Load, Now: time.Now, Epoch: func() (bool, uint64) { return true, epoch.Load() }, Event: ev.add})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	kind := ticket.TCP(tg.port())
	open := func(id string) {
		tok, _ := sign(t, k, "k1", func(c *ticket.Claims) { c.Kind = kind })
		m.Open(ctx, &bcdv1.OpenTunnel{TunnelId: id, Target: kind, Ticket: tok})
		if f := first(t, g); f.GetError() != "" {
			t.Fatal(f.GetError())
		}
		waitFor(t, func() bool { return len(m.List()) == 1 })
	}
	open("t-session")
	epoch.Store(2) // the session ended and a new one began
	waitFor(t, func() bool { return len(m.List()) == 0 })
	open("t-jwks")
	jwks.Store(jwksOf(mustKey(t), "k2"))
	waitFor(t, func() bool { return len(m.List()) == 0 })
	ev.mu.Lock()
	defer ev.mu.Unlock()
	all := strings.Join(ev.all, "\n")
	if !strings.Contains(all, "the session it came in ended") || !strings.Contains(all, "left the access section's JWKS") {
		t.Fatalf("events:\n%s", all)
	}
}
