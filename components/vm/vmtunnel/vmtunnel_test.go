package vmtunnel_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/trust/ticket"
	"github.com/better-compute/bcd/components/vm/fakeruntime"
	"github.com/better-compute/bcd/components/vm/netguard"
	"github.com/better-compute/bcd/components/vm/vmruntime"
	"github.com/better-compute/bcd/components/vm/vmtunnel"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// vm-a and vm-b both want RUNNING with a PRIVATE NIC on br0 (vm-a's with
// an IPv4 and an IPv6 address); the runtime runs vm-a and has vm-b
// STOPPED.
const section = `{"instances":[
 {"id":"vm-a","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24","fd09::5/64"],"policy":"PRIVATE"}]},
 {"id":"vm-b","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0b:00:01","addresses":["10.9.0.6/24"],"policy":"PRIVATE"}]}]}`

// gateway hands each accepted Tunnel stream to the test, and each
// refusal's error.
type gateway struct {
	bcdv1connect.UnimplementedAgentGatewayHandler
	first chan *bcdv1.TunnelData
	open  chan *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData]
	done  chan struct{}
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
	g.open <- st
	select {
	case <-g.done:
	case <-ctx.Done():
	}
	return nil
}

// echo serves on addr inside ns: each connection gets greeting, then
// its bytes back.
func echo(t *testing.T, ns *netpolicytest.NS, addr, greeting string) {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.WriteString(c, greeting); io.Copy(c, c) }()
		}
	}()
}

type lab struct {
	m      *tunnel.Manager
	g      *gateway
	key    *ecdsa.PrivateKey
	dir    string
	client bcdv1connect.AgentGatewayClient
	cfg    tunnel.Config
}

func (l *lab) sign(t *testing.T, instance, kind string) string {
	t.Helper()
	now := time.Now()
	tok, err := ticket.Sign(l.key, "k1", ticket.Claims{Node: "node-1", Kind: kind, Account: "operator", Instance: instance,
		JTI: tunnel.NewID(), Issued: now, Expiry: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// open opens a tunnel and returns its stream, or the refusal.
func (l *lab) open(t *testing.T, m *tunnel.Manager, kind, tok string) (*connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData], string) {
	t.Helper()
	m.Open(context.Background(), &bcdv1.OpenTunnel{TunnelId: tunnel.NewID(), Target: kind, Ticket: tok})
	select {
	case f := <-l.g.first:
		if f.GetError() != "" {
			return nil, f.GetError()
		}
		return <-l.g.open, ""
	case <-time.After(15 * time.Second):
		t.Fatal("no Tunnel stream within 15 s")
		return nil, ""
	}
}

// read reads from the tunnel until it holds want.
func read(t *testing.T, st *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData], want string) {
	t.Helper()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		f, err := st.Receive()
		if err != nil {
			t.Fatalf("the tunnel ended with %q, want %q: %v", got.String(), want, err)
		}
		got.Write(f.GetData())
	}
}

func newLab(t *testing.T) (*lab, *netpolicytest.NS) {
	host := netpolicytest.New(t)
	host.Bridge("br0", "10.9.0.1/24", "fd09::1/64")
	a := host.Guest("br0", netpolicy.TapName("vm-a", 0), "52:54:00:0a:00:01", "10.9.0.5/24")
	a.Run("sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0")
	a.Run("ip", "-6", "addr", "add", "fd09::5/64", "dev", "eth0", "nodad")
	b := host.Guest("br0", netpolicy.TapName("vm-b", 0), "52:54:00:0b:00:01", "10.9.0.6/24")
	echo(t, a, "10.9.0.5:7000", "vm-a:")
	echo(t, a, "[fd09::5]:7000", "vm-a6:")
	echo(t, a, "[fd09::5]:7001", "vm-a6:")
	echo(t, a, "10.9.0.5:22", "SSH-2.0-vm-a\r\n")
	echo(t, b, "10.9.0.6:7000", "vm-b:")
	echo(t, host, "10.9.0.1:7000", "host:")

	guard := netguard.New(&netpolicytest.Helper{NS: host}, nil)
	if _, err := guard.Apply(context.Background(), []byte(section), rootsig.Proof{}); err != nil {
		t.Fatal(err)
	}
	rt, err := fakeruntime.New(t.TempDir(), func() (string, error) { return "boot-1", nil })
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"vm-a", "vm-b"} {
		if _, err := rt.Ensure(context.Background(), vmruntime.InstanceMachine(id, 1, 64, strings.Repeat("a", 64), "qcow2", nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.SetState(context.Background(), "vm-a", vmruntime.Running); err != nil {
		t.Fatal(err)
	}

	g := &gateway{first: make(chan *bcdv1.TunnelData, 8), open: make(chan *connect.BidiStream[bcdv1.TunnelData, bcdv1.TunnelData], 8), done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle(bcdv1connect.NewAgentGatewayHandler(g))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(func() { close(g.done); srv.Close() })
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	client := bcdv1connect.NewAgentGatewayClient(&http.Client{Transport: &http.Transport{Protocols: p}}, srv.URL, connect.WithGRPC())

	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks := &jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: "k1", Algorithm: "ES256"}}}
	l := &lab{g: g, key: k, dir: t.TempDir(), client: client}
	l.cfg = tunnel.Config{NodeID: "node-1", DataDir: l.dir, Client: client,
		JWKS: func() *jose.JSONWebKeySet { return jwks }, Now: time.Now,
		Epoch:     func() (bool, uint64) { return true, 1 },
		Instances: vmtunnel.Targets{Guard: guard, List: rt.List},
		// The node's side of the bridge is the test's namespace.
		DialTCP: func(ctx context.Context, to netip.AddrPort) (c net.Conn, err error) {
			err = host.Do(func() error {
				var d net.Dialer
				c, err = d.DialContext(ctx, "tcp", to.String())
				return err
			})
			return c, err
		},
		HostAddrs: func() (out []netip.Addr, err error) {
			err = host.Do(func() error {
				as, err := net.InterfaceAddrs()
				for _, a := range as {
					if p, perr := netip.ParsePrefix(a.String()); perr == nil {
						out = append(out, p.Addr())
					}
				}
				return err
			})
			return out, err
		},
	}
	l.m = l.start(t, l.cfg)
	return l, host
}

func (l *lab) start(t *testing.T, cfg tunnel.Config) *tunnel.Manager {
	m := tunnel.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go m.Run(ctx)
	return m
}

// TestInstanceTCP: an instance ticket's tcp and ssh tunnels reach the
// instance's own address (a listener in the guest's namespace, through
// its tap, the bridge and the loaded tables); the same ticket again, a
// ticket for an instance the runtime has STOPPED and one for an instance
// this node does not have are refused, and nothing of vm-b or the host
// answers.
func TestInstanceTCP(t *testing.T) {
	testenv.NeedRoot(t, "it makes network namespaces and loads nftables")
	l, _ := newLab(t)
	kind := ticket.TCP(7000)
	tok := l.sign(t, "vm-a", kind)
	st, refused := l.open(t, l.m, kind, tok)
	if refused != "" {
		t.Fatalf("vm-a tcp:7000 refused: %s", refused)
	}
	if err := st.Send(&bcdv1.TunnelData{Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	read(t, st, "vm-a:hello")

	st, refused = l.open(t, l.m, ticket.KindSSH, l.sign(t, "vm-a", ticket.KindSSH))
	if refused != "" {
		t.Fatalf("vm-a ssh refused: %s", refused)
	}
	read(t, st, "SSH-2.0-vm-a")

	for name, c := range map[string]struct{ tok, want string }{
		"replayed":               {tok, "already used"},
		"stopped in the runtime": {l.sign(t, "vm-b", kind), "vm-b is STOPPED, not running"},
		"not on this node":       {l.sign(t, "vm-c", kind), "vm-c is not on this node"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, refused := l.open(t, l.m, kind, c.tok); !strings.Contains(refused, c.want) {
				t.Fatalf("refusal %q, want %q", refused, c.want)
			}
		})
	}
	// A node without instances refuses every instance ticket.
	cfg := l.cfg
	cfg.Instances, cfg.DataDir = nil, t.TempDir()
	if _, refused := l.open(t, l.start(t, cfg), kind, l.sign(t, "vm-a", kind)); !strings.Contains(refused, "runs no instances") {
		t.Fatalf("a node without instances: %q", refused)
	}
}

// TestEveryAddress: a tcp ticket dials the instance's addresses in order,
// IPv4 first, until one answers: vm-a's port 7000, open on both, is
// reached on its IPv4 address; 7001, open on its IPv6 address only, on
// that; 7002, open on neither, is refused naming both.
func TestEveryAddress(t *testing.T) {
	testenv.NeedRoot(t, "it makes network namespaces and loads nftables")
	l, _ := newLab(t)
	for _, c := range []struct {
		port int
		want string
	}{{7000, "vm-a:"}, {7001, "vm-a6:"}} {
		st, refused := l.open(t, l.m, ticket.TCP(c.port), l.sign(t, "vm-a", ticket.TCP(c.port)))
		if refused != "" {
			t.Fatalf("vm-a tcp:%d refused: %s", c.port, refused)
		}
		if err := st.Send(&bcdv1.TunnelData{Data: []byte("hello")}); err != nil {
			t.Fatal(err)
		}
		read(t, st, c.want+"hello")
	}
	_, refused := l.open(t, l.m, ticket.TCP(7002), l.sign(t, "vm-a", ticket.TCP(7002)))
	for _, want := range []string{"10.9.0.5:7002", "[fd09::5]:7002", "refused"} {
		if !strings.Contains(refused, want) {
			t.Errorf("vm-a tcp:7002 refused with %q, want it to name %q", refused, want)
		}
	}
}

// wrong gives the addresses it holds for any instance: an address
// source gone wrong, so the tunnel's own check is what refuses.
type wrong []netip.Addr

func (w wrong) Addresses(context.Context, string) ([]netip.Addr, error) { return w, nil }
func (w wrong) Console(context.Context, string) (tunnel.Target, error) {
	return nil, io.EOF
}

// TestNeverTheHost: whatever the instances' side answers, an instance
// tunnel never dials the host's bridge address, loopback or a link-local
// address (listeners wait on the first two); given those before the
// instance's own address, it skips them and reaches the instance.
func TestNeverTheHost(t *testing.T) {
	testenv.NeedRoot(t, "it makes network namespaces and loads nftables")
	l, host := newLab(t)
	echo(t, host, "127.0.0.1:7000", "loopback:")
	for _, c := range []struct{ addr, want string }{
		{"10.9.0.1", "address of this host"},
		{"127.0.0.1", "loopback"},
		{"::1", "loopback"},
		{"fe80::1", "link-local"},
		{"169.254.169.254", "link-local"},
	} {
		t.Run(c.addr, func(t *testing.T) {
			cfg := l.cfg
			cfg.Instances, cfg.DataDir = wrong{netip.MustParseAddr(c.addr)}, t.TempDir()
			if _, refused := l.open(t, l.start(t, cfg), ticket.TCP(7000), l.sign(t, "vm-a", ticket.TCP(7000))); !strings.Contains(refused, c.want) {
				t.Fatalf("refusal %q, want %q", refused, c.want)
			}
		})
	}
	cfg := l.cfg
	cfg.Instances, cfg.DataDir = wrong{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("fe80::1"), netip.MustParseAddr("10.9.0.5")}, t.TempDir()
	st, refused := l.open(t, l.start(t, cfg), ticket.TCP(7000), l.sign(t, "vm-a", ticket.TCP(7000)))
	if refused != "" {
		t.Fatalf("refused: %s", refused)
	}
	if err := st.Send(&bcdv1.TunnelData{Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	for !strings.Contains(got.String(), "hello") {
		f, err := st.Receive()
		if err != nil {
			t.Fatalf("the tunnel ended with %q: %v", got.String(), err)
		}
		got.Write(f.GetData())
	}
	if got.String() != "vm-a:hello" {
		t.Fatalf("the tunnel reached %q, want vm-a (vm-a:hello)", got.String())
	}
}
