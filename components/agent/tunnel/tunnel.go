// Package tunnel is the agent's half of tunnels: on OpenTunnel it verifies
// the exec ticket (the access section's JWKS, this node, the clock) and
// spends its jti durably, opens the target (the node's loopback sshd, a
// loopback TCP port, or a login shell on a pseudo-terminal; for an
// instance ticket, the instance's serial console or a port of the
// instance's own address, never a loopback, link-local or host address),
// then dials
// the gateway's Tunnel stream and carries the bytes both ways. At most
// MaxOpen tunnels are open at once; each closes when its ticket expires,
// its signing key leaves the JWKS, or the session it came in ends. Flow
// control is HTTP/2's: a side that stops reading stops the other side's
// sends, and each direction holds at most one frame in this process.
// docs/access.md describes tunnels.
package tunnel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/base/flowwin"
	"github.com/better-compute/bcd/components/trust/ticket"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// Limits.
const (
	MaxOpen   = 16       // tunnels open at once per node
	FrameSize = 32 << 10 // bytes of one TunnelData
	checkTick = time.Second
)

// Target is an open target: bytes both ways, and a console's resize.
type Target interface {
	io.ReadWriteCloser
	// CloseWrite ends what the tunnel writes to the target (EOF).
	CloseWrite() error
	// Resize sets a console's terminal size (others ignore it).
	Resize(rows, cols uint16) error
}

// Config is what a Manager needs.
type Config struct {
	NodeID  string
	DataDir string
	Client  bcdv1connect.AgentGatewayClient
	// JWKS is the exec-ticket JWKS the access section holds (nil: every
	// ticket is refused).
	JWKS func() *jose.JSONWebKeySet
	// Now is the agent's working clock.
	Now func() time.Time
	// Epoch is the session's state: a tunnel closes once the session it
	// came in ends.
	Epoch func() (connected bool, epoch uint64)
	// SSHPort is the node's loopback sshd ([access] ssh_port, 22).
	SSHPort int
	// Console opens a login shell of account on a pseudo-terminal (nil:
	// console tickets are refused).
	Console func(ctx context.Context, account string) (Target, error)
	// Instances opens the targets of instance tickets (nil: this node
	// runs no instances, and every instance ticket is refused).
	Instances Instances
	// DialTCP dials an instance's address (nil: a net.Dialer; tests dial
	// inside the network namespace they make).
	DialTCP func(ctx context.Context, to netip.AddrPort) (net.Conn, error)
	// HostAddrs lists this host's own addresses, which no instance
	// tunnel dials (nil: every interface's, net.InterfaceAddrs).
	HostAddrs func() ([]netip.Addr, error)
	// Event records a journal event (tunnel.opened, tunnel.closed,
	// tunnel.refused).
	Event func(typ string, body any)
	Log   *slog.Logger
}

// Instances is what instance tickets need of the node's instances.
type Instances interface {
	// Addresses are the addresses a tunnel to instance id dials, in
	// order (IPv4 first): the instance's own, as the loaded network
	// policy binds them, of an instance of this node that runs; an error
	// otherwise.
	Addresses(ctx context.Context, id string) ([]netip.Addr, error)
	// Console opens the serial console of instance id, a running
	// instance of this node that bcd manages.
	Console(ctx context.Context, id string) (Target, error)
}

// Info is one open tunnel, as bcd status lists it.
type Info struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"`
	Instance string    `json:"instance,omitempty"` // an instance ticket's instance
	Account  string    `json:"account"`
	JTI      string    `json:"jti"`
	Opened   time.Time `json:"opened"`
	Expires  time.Time `json:"expires"`
	BytesIn  int64     `json:"bytes_in"`  // from the gateway to the target
	BytesOut int64     `json:"bytes_out"` // from the target to the gateway
}

type tun struct {
	info    Info
	kid     string
	epoch   uint64
	cancel  context.CancelCauseFunc
	in, out atomic.Int64
}

// Manager runs the node's tunnels.
type Manager struct {
	cfg   Config
	spent *Spent
	mu    sync.Mutex
	open  map[string]*tun
	// opening counts tunnels past the count check not yet in open.
	opening int
}

// New returns a manager; its spent set is data_dir/spent-tickets.json.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.SSHPort == 0 {
		cfg.SSHPort = 22
	}
	if cfg.Event == nil {
		cfg.Event = func(string, any) {}
	}
	return &Manager{cfg: cfg, spent: OpenSpent(cfg.DataDir), open: map[string]*tun{}}
}

// List is the open tunnels, oldest first.
func (m *Manager) List() []Info {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Info, 0, len(m.open))
	for _, t := range m.open {
		i := t.info
		i.BytesIn, i.BytesOut = t.in.Load(), t.out.Load()
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Opened.Before(out[b].Opened) })
	return out
}

// Open handles one OpenTunnel in the background; the session goes on.
func (m *Manager) Open(ctx context.Context, ot *bcdv1.OpenTunnel) {
	go m.run(ctx, ot)
}

// Run closes tunnels whose ticket expired, whose key left the JWKS or
// whose session ended, until ctx ends (then it closes them all).
func (m *Manager) Run(ctx context.Context) error {
	tick := time.NewTicker(checkTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			m.closeAll(errors.New("the agent is stopping"))
			return nil
		case <-tick.C:
			m.sweep()
		}
	}
}

func (m *Manager) sweep() {
	m.mu.Lock()
	none := len(m.open) == 0
	m.mu.Unlock()
	if none {
		return // nothing to check: an idle agent reads no epoch or JWKS each tick
	}
	now := m.cfg.Now()
	connected, epoch := m.cfg.Epoch()
	jwks := m.cfg.JWKS()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.open {
		switch {
		case !now.Before(t.info.Expires):
			t.cancel(errors.New("the ticket expired"))
		case !connected || epoch != t.epoch:
			t.cancel(errors.New("the session it came in ended"))
		case jwks == nil || len(jwks.Key(t.kid)) == 0:
			t.cancel(errors.New("its ticket's key left the access section's JWKS"))
		}
	}
}

func (m *Manager) closeAll(cause error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range m.open {
		t.cancel(cause)
	}
}

// refuse tells the gateway (a first frame with error and close) and
// records the refusal (with the ticket's instance, once it verified).
func (m *Manager) refuse(ctx context.Context, ot *bcdv1.OpenTunnel, c ticket.Claims, err error) {
	m.cfg.Log.Warn("tunnel refused", "tunnel_id", ot.GetTunnelId(), "target", ot.GetTarget(), "instance", c.Instance, "jti", c.JTI, "err", err)
	ev := map[string]any{"tunnel_id": ot.GetTunnelId(), "kind": ot.GetTarget(), "jti": c.JTI, "error": err.Error()}
	if c.Instance != "" {
		ev["instance"] = c.Instance
	}
	m.cfg.Event("tunnel.refused", ev)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := m.cfg.Client.Tunnel(sctx)
	_ = st.Send(&bcdv1.TunnelData{TunnelId: ot.GetTunnelId(), Close: true, Error: err.Error()})
	_ = st.CloseRequest()
	_, _ = st.Receive() // the gateway's close, or the end of the stream
	_ = st.CloseResponse()
}

// admit verifies the ticket, takes a place and spends the jti.
func (m *Manager) admit(ot *bcdv1.OpenTunnel) (ticket.Claims, string, error) {
	jwks := m.cfg.JWKS()
	c, err := ticket.Verify(ot.GetTicket(), jwks, m.cfg.NodeID, m.cfg.Now())
	if err != nil {
		return c, "", err
	}
	if ot.GetTarget() != c.Kind {
		return c, "", fmt.Errorf("%w: OpenTunnel asks for %q, the ticket is for %q", ticket.ErrRefused, ot.GetTarget(), c.Kind)
	}
	if !validID(ot.GetTunnelId()) {
		return c, "", errors.New("tunnel_id must be 1 to 64 characters of [A-Za-z0-9_-]")
	}
	kid := ""
	if tok, err := jose.ParseSigned(ot.GetTicket(), []jose.SignatureAlgorithm{jose.ES256}); err == nil && len(tok.Signatures) == 1 {
		kid = tok.Signatures[0].Header.KeyID
	}
	m.mu.Lock()
	if len(m.open)+m.opening >= MaxOpen {
		m.mu.Unlock()
		return c, "", fmt.Errorf("%d tunnels are open on this node, the most it allows", MaxOpen)
	}
	m.opening++
	m.mu.Unlock()
	if err := m.spent.Spend(c.JTI, c.Expiry, m.cfg.Now()); err != nil {
		m.mu.Lock()
		m.opening--
		m.mu.Unlock()
		return c, "", err
	}
	return c, kid, nil
}

func validID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// dial opens the ticket's target.
func (m *Manager) dial(ctx context.Context, c ticket.Claims) (Target, error) {
	if c.Instance != "" {
		return m.dialInstance(ctx, c)
	}
	port := 0
	switch {
	case c.Kind == ticket.KindSSH:
		port = m.cfg.SSHPort
	case c.Kind == ticket.KindConsole:
		if m.cfg.Console == nil {
			return nil, errors.New("this node opens no console")
		}
		return m.cfg.Console(ctx, c.Account)
	default:
		port = c.TCPPort()
	}
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("dial 127.0.0.1:%d: %w", port, err)
	}
	return tcpTarget{conn.(*net.TCPConn)}, nil
}

type tcpTarget struct{ *net.TCPConn }

func (tcpTarget) Resize(uint16, uint16) error { return nil }

// Bounds of an instance tunnel's dial: each address, and all of them.
const (
	instanceDialEach = 10 * time.Second
	instanceDialAll  = 30 * time.Second
)

// dialInstance opens an instance ticket's target: the instance's serial
// console, or port 22 (ssh) or the ticket's port (tcp) of the first of
// the addresses Instances gives that answers, each one an address no
// host or link has: not loopback, link-local, multicast, unspecified,
// nor one of this host's own (such an address is never dialed).
func (m *Manager) dialInstance(ctx context.Context, c ticket.Claims) (Target, error) {
	if m.cfg.Instances == nil {
		return nil, fmt.Errorf("instance %s: this node runs no instances", c.Instance)
	}
	if c.Kind == ticket.KindConsole {
		return m.cfg.Instances.Console(ctx, c.Instance)
	}
	port := 22
	if c.Kind != ticket.KindSSH {
		port = c.TCPPort()
	}
	as, err := m.cfg.Instances.Addresses(ctx, c.Instance)
	if err != nil {
		return nil, fmt.Errorf("instance %s: %w", c.Instance, err)
	}
	dial := m.cfg.DialTCP
	if dial == nil {
		dial = func(ctx context.Context, to netip.AddrPort) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", to.String())
		}
	}
	actx, cancel := context.WithTimeout(ctx, instanceDialAll)
	defer cancel()
	var errs []error
	for _, a := range as {
		if err := m.instanceAddr(a); err != nil {
			errs = append(errs, err)
			continue
		}
		to := netip.AddrPortFrom(a.Unmap(), uint16(port))
		dctx, cancel := context.WithTimeout(actx, instanceDialEach)
		conn, err := dial(dctx, to)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("dial %s: %w", to, err))
			continue
		}
		tc, ok := conn.(*net.TCPConn)
		if !ok {
			conn.Close()
			errs = append(errs, fmt.Errorf("dial %s: not a TCP connection", to))
			continue
		}
		return tcpTarget{tc}, nil
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no address to dial"))
	}
	return nil, fmt.Errorf("instance %s: %w", c.Instance, errors.Join(errs...))
}

// instanceAddr refuses an address an instance tunnel must never dial.
func (m *Manager) instanceAddr(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified():
		return errors.New("no address to dial")
	case a.IsLoopback():
		return fmt.Errorf("%s is a loopback address: an instance tunnel never reaches the host", a)
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return fmt.Errorf("%s is a link-local address: an instance tunnel dials only the instance's own address", a)
	case a.IsMulticast():
		return fmt.Errorf("%s is a multicast address", a)
	}
	host := m.cfg.HostAddrs
	if host == nil {
		host = interfaceAddrs
	}
	own, err := host()
	if err != nil {
		return fmt.Errorf("listing this host's addresses: %w", err)
	}
	for _, h := range own {
		if h.Unmap() == a {
			return fmt.Errorf("%s is an address of this host: an instance tunnel never reaches the host", a)
		}
	}
	return nil
}

// interfaceAddrs are the addresses of every interface of this host.
func interfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// TTYTarget is a terminal's file as a target: an instance's serial
// console (the slave of the pseudo-terminal its VMM holds), which has no
// size and no half-close. A read of a terminal whose other side closed
// (the instance stopped) is the end of it.
func TTYTarget(f *os.File) Target { return ttyTarget{f} }

type ttyTarget struct{ *os.File }

func (t ttyTarget) Read(b []byte) (int, error) {
	n, err := t.File.Read(b)
	if err != nil && isEIO(err) {
		err = io.EOF
	}
	return n, err
}

func (ttyTarget) CloseWrite() error           { return nil }
func (ttyTarget) Resize(uint16, uint16) error { return nil }

func (m *Manager) run(ctx context.Context, ot *bcdv1.OpenTunnel) {
	_, epoch := m.cfg.Epoch()
	c, kid, err := m.admit(ot)
	if err != nil {
		m.refuse(ctx, ot, c, err)
		return
	}
	tctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := &tun{info: Info{ID: ot.GetTunnelId(), Kind: c.Kind, Instance: c.Instance, Account: c.Account, JTI: c.JTI, Opened: m.cfg.Now(), Expires: c.Expiry},
		kid: kid, epoch: epoch, cancel: cancel}
	target, err := m.dial(tctx, c)
	m.mu.Lock()
	m.opening--
	if err == nil {
		m.open[t.info.ID] = t
	}
	m.mu.Unlock()
	if err != nil {
		m.refuse(ctx, ot, c, err)
		return
	}
	ev := map[string]any{"tunnel_id": t.info.ID, "jti": c.JTI, "kind": c.Kind, "account": c.Account}
	if c.Instance != "" {
		ev["instance"] = c.Instance
	}
	m.cfg.Event("tunnel.opened", ev)
	m.cfg.Log.Info("tunnel opened", "tunnel_id", t.info.ID, "kind", c.Kind, "instance", c.Instance, "account", c.Account, "jti", c.JTI)
	reason := m.carry(tctx, t, target)
	target.Close()
	m.mu.Lock()
	delete(m.open, t.info.ID)
	m.mu.Unlock()
	closed := map[string]any{"tunnel_id": t.info.ID, "jti": c.JTI, "kind": c.Kind, "account": c.Account,
		"reason": reason, "bytes_in": t.in.Load(), "bytes_out": t.out.Load()}
	if c.Instance != "" {
		closed["instance"] = c.Instance
	}
	m.cfg.Event("tunnel.closed", closed)
	m.cfg.Log.Info("tunnel closed", "tunnel_id", t.info.ID, "reason", reason, "bytes_in", t.in.Load(), "bytes_out", t.out.Load())
}

// carry opens the Tunnel stream and copies both ways until both
// directions ended or the tunnel is closed; it returns why it ended. Each
// direction keeps to a flowwin window: the target's bytes wait for the
// gateway's acks, and the gateway's bytes are acked once written to the
// target, so neither side holds more than a window of the other's.
func (m *Manager) carry(ctx context.Context, t *tun, target Target) string {
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	st := m.cfg.Client.Tunnel(sctx)
	var sendMu sync.Mutex
	send := func(f *bcdv1.TunnelData) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return st.Send(f)
	}
	if err := send(&bcdv1.TunnelData{TunnelId: t.info.ID}); err != nil {
		return "opening the Tunnel stream: " + err.Error()
	}
	win := flowwin.New()
	defer win.Close()
	var wg sync.WaitGroup
	var once sync.Once
	reason := "closed by both ends"
	end := func(r string) { once.Do(func() { reason = r }) }
	// The gateway's frames: acks at once, data to the writer below (at
	// most a window of it, as the gateway keeps to the window).
	in := make(chan *bcdv1.TunnelData, flowwin.Size/FrameSize+4)
	wg.Add(3)
	go func() { // target -> gateway
		defer wg.Done()
		buf := make([]byte, FrameSize)
		for {
			n, err := target.Read(buf)
			if n > 0 {
				if werr := win.Take(sctx, n); werr != nil {
					return
				}
				t.out.Add(int64(n))
				if serr := send(&bcdv1.TunnelData{Data: buf[:n]}); serr != nil {
					end("sending to the gateway: " + serr.Error())
					stop()
					return
				}
			}
			if err != nil {
				_ = send(&bcdv1.TunnelData{Close: true})
				if !errors.Is(err, io.EOF) && sctx.Err() == nil {
					end("reading the target: " + err.Error())
				}
				return
			}
		}
	}()
	go func() { // gateway frames
		defer wg.Done()
		defer close(in)
		for {
			f, err := st.Receive()
			if err != nil {
				if sctx.Err() == nil && !errors.Is(err, io.EOF) {
					end("the Tunnel stream: " + err.Error())
				}
				return
			}
			if a := f.GetAck(); a > 0 {
				win.Ack(a)
			}
			if len(f.GetData()) > 0 || f.GetClose() || f.GetRows() > 0 {
				select {
				case in <- f:
				case <-sctx.Done():
					return
				}
			}
			if f.GetClose() {
				return
			}
		}
	}()
	go func() { // -> target
		defer wg.Done()
		var consumed flowwin.Consumed
		for f := range in {
			if f.GetRows() > 0 && f.GetCols() > 0 && f.GetRows() <= 10000 && f.GetCols() <= 10000 {
				_ = target.Resize(uint16(f.GetRows()), uint16(f.GetCols()))
			}
			if len(f.GetData()) > 0 {
				t.in.Add(int64(len(f.GetData())))
				if _, werr := target.Write(f.GetData()); werr != nil {
					end("writing the target: " + werr.Error())
					stop()
					return
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
		_ = target.CloseWrite()
		if t.info.Kind == ticket.KindConsole {
			stop() // a console has no half-close
		}
	}()
	// Whatever stops the tunnel closes the target, so a read blocked on
	// it returns.
	go func() { <-sctx.Done(); win.Close(); target.Close() }()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		end(context.Cause(ctx).Error())
		stop()
		<-done
	}
	sendMu.Lock()
	_ = st.CloseRequest()
	sendMu.Unlock()
	_ = st.CloseResponse()
	return reason
}

// NewID is a random tunnel or ticket id.
func NewID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var _ = connect.CodeCanceled
