package agent

import (
	"context"
	"crypto"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	jose "github.com/go-jose/go-jose/v4"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent/clock"
	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/agent/renew"
	"github.com/better-compute/bcd/components/agent/report"
	"github.com/better-compute/bcd/components/agent/resident"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/telemetry"
	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/agent/tunnel"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Config configures an agent.
type Config struct {
	Config  *config.Config
	Role    string
	Kinds   []dispatch.Kind
	Version string
	Log     *slog.Logger
	// BackoffBase and BackoffMax shape redials (defaults 1 s and 1 min).
	BackoffBase, BackoffMax time.Duration
	// Sections are the NodeSpec sections this role converges
	// (components/agent/converge); a section the spec names and the role
	// lacks is reported SectionUnsupported.
	Sections []converge.Section
	// Machine is what the role reports about its machine.
	Machine report.Machine
	// ReportSections, when set, is given the function that sets the
	// role's own report sections (a JSON object: a site's image cache).
	ReportSections func(set func([]byte))
	// Kicker, when set, is given the converge engine's Kick: sections
	// whose background work ended call it.
	Kicker func(kick func())
	// Watch, when set, runs beside the session until ctx ends (the node's
	// health monitor) and calls changed when what Machine reports changed.
	Watch func(ctx context.Context, changed func()) error
	// BootLease, when set, reports the site's boot lease for bcd status.
	BootLease func() (held bool, left time.Duration)
	// StatusGPUs, when set, gives bcd status one line per GPU.
	StatusGPUs func(context.Context) []status.GPU
	// StatusHost, when set, gives bcd status the host units' states.
	StatusHost func() []status.HostUnit
	// StatusTaps, when set, gives bcd status the instances' taps.
	StatusTaps func() []status.Tap
	// InstanceTokens, when set, is given the function that asks the
	// gateway, through the session, for an instance's workload token (the
	// metadata service's identity tokens).
	InstanceTokens func(get func(ctx context.Context, instance, audience string) (string, error))
	// StatusInstances, when set, gives bcd status the instances' domains
	// and whether the runtime listed them all.
	StatusInstances func() ([]status.Instance, bool)
	// FakeReboot adds the fakehw node.reboot kind: Run then returns
	// ErrRebooted and the caller starts the agent again.
	FakeReboot bool
	// Reboot, when set (and FakeReboot is not), adds the host's
	// node.reboot kind: it asks the host to reboot (through bcd helper
	// when unprivileged) and waits to be stopped by it.
	Reboot func(ctx context.Context, reason string) error
	// Welcomed, when set, runs after each Welcome (self-update confirms
	// the running release on the first; bcd sim paces the start of its
	// machines on it).
	Welcomed func(ctx context.Context)
	// Restarter, when set, is given the agent's restart: it stops the
	// agent and Run returns ErrRestart (self-update after a swap).
	Restarter func(restart func())
	// RenewAfter, when set, renews the certificate this soon after start
	// (BCD_RENEW_AFTER, fakehw builds), then at 60% of each lifetime.
	RenewAfter time.Duration
	// TPM, when set, is the host's usable TPM: a node.key held in it is
	// derived from it, and renewals make the next key in it (see renew).
	TPM renew.TPM
	// Drivers, when set, lists the hosted bcx drivers for Hello.
	Drivers func() []*bcdv1.Driver
	// Capabilities, when set, says in Hello what the host offers.
	Capabilities func() []string
	// Tunnels is what the role's tunnels open (the node's access section's
	// JWKS, its sshd port, its consoles); without a JWKS every OpenTunnel
	// is refused.
	Tunnels Tunnels
	// Telemetry, when set, adds the telemetry section (node and site):
	// the agent's own metrics and these sources, over OTLP/HTTP.
	Telemetry *Telemetry
}

// Tunnels is the role's part of tunnels (components/agent/tunnel).
type Tunnels struct {
	JWKS    func() *jose.JSONWebKeySet
	SSHPort int
	Console func(ctx context.Context, account string) (tunnel.Target, error)
	// Instances opens instance tickets' targets (nil: none).
	Instances tunnel.Instances
}

// Run runs the agent until ctx ends (nil) or the node is revoked.
func Run(ctx context.Context, c Config) error {
	cfg := c.Config
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	a, err := identity.LoadWith(cfg.DataDir, c.TPM)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if a.KeyHolder == identity.KeyInTPM && c.TPM == nil {
		return fmt.Errorf("agent: node.key is held in the TPM, which this process could not open")
	}
	var keyHolder atomic.Value
	keyHolder.Store(a.KeyHolder)
	if a.Role != c.Role {
		return fmt.Errorf("this data directory holds a %s identity; join with a %s token (bcd join --role %s)", a.Role, c.Role, c.Role)
	}
	nodeLog := c.Log.With("node", a.NodeID)
	log := nodeLog.With("component", "agent")
	if time.Now().After(a.Cert.NotAfter) {
		log.Warn("certificate expired; the gateway will refuse it (run bcd join --reset)", "not_after", a.Cert.NotAfter)
	}
	bootID, err := hostinfo.BootID(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	clk, err := clock.Open(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if clk.Damaged != nil {
		log.Error("the clock mark was unreadable", "err", clk.Damaged)
	}
	var cert atomic.Pointer[tls.Certificate]
	tc := a.TLSCertificate()
	cert.Store(&tc)
	client, hc, err := transport.Client(transport.Options{
		URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin,
		ClientCert: func() (*tls.Certificate, error) { return cert.Load(), nil },
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer hc.CloseIdleConnections()
	var ws *transport.WS // the WebSocket fallback, with [websocket] url
	if cfg.WebSocket.URL != "" {
		if ws, err = transport.NewWS(transport.WSOptions{URL: cfg.WebSocket.URL, CAFile: cfg.WebSocket.CAFile, SigningPin: cfg.JoinSigningKeyPin}); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		client, hc = ws.Gateway(cert.Load), ws.HTTPClient()
		defer hc.CloseIdleConnections()
	}
	j, opened, err := journal.Open(filepath.Join(cfg.DataDir, journal.File), a.NodeID)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer j.Close()
	if opened.MovedAside != "" {
		log.Error("the journal was unreadable; moved aside and started anew", "moved_to", opened.MovedAside, "err", opened.Reason)
	}
	if opened.Imported != "" {
		log.Info("the previous release's journal imported", "moved_to", opened.Imported)
	}
	if opened.TornTail > 0 {
		log.Info("the journal's log ended in a write torn by a crash; cut", "bytes", opened.TornTail, "records_replayed", opened.Replayed)
	}
	// sctx ends the session: on ctx, when the dispatcher fails, or when a
	// fakehw reboot asks.
	sctx, stopS := context.WithCancel(ctx)
	defer stopS()
	var rebooting, restarting atomic.Bool
	if c.Restarter != nil {
		c.Restarter(func() { restarting.Store(true); stopS() })
	}
	trust, err := bundle.Load(cfg.DataDir, cfg.JoinSigningKeyPin)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if v := trust.Version(); v > 0 {
		log.Info("trust bundle held", "version", v, "signed_intent", trust.Enforced())
	}
	events := newEventLog(j, a.NodeID, func() crypto.Signer { k, _ := cert.Load().PrivateKey.(crypto.Signer); return k })
	var rep *report.Reporter
	sections := c.Sections
	var tel *telemetry.Telemetry
	var s *session.Session
	var d *dispatch.Dispatcher
	if c.Telemetry != nil {
		// The section reads the session and the dispatcher only once
		// the engine runs, after both exist.
		tel = newTelemetry(c, a, func() *session.Session { return s }, j, func() *dispatch.Dispatcher { return d }, &cert, clk.Now)
		sections = append(append([]converge.Section{}, sections...), tel)
	}
	// A section that fetches secrets of its own (the instances' user
	// data) asks through the session, sealed, once there is one.
	for _, sec := range sections {
		if u, ok := sec.(interface {
			SetSecret(func(ctx context.Context, name, workflowID string) ([]byte, error))
		}); ok {
			u.SetSecret(func(ctx context.Context, name, workflowID string) ([]byte, error) {
				if s == nil {
					return nil, errors.New("no session with the gateway yet")
				}
				return s.Secret(ctx, name, workflowID, "")
			})
		}
	}
	if c.InstanceTokens != nil {
		c.InstanceTokens(func(ctx context.Context, instance, audience string) (string, error) {
			if s == nil {
				return "", errors.New("no session with the gateway yet")
			}
			return s.InstanceToken(ctx, instance, audience)
		})
	}
	engine, err := converge.Open(converge.Config{DataDir: cfg.DataDir, Sections: sections, Log: nodeLog, Now: clk.Now, Repair: cfg.Host.Repair(),
		Verify: func(ds *bcdv1.DesiredState, full nodespec.Spec) error {
			return trust.Roots().VerifyDesiredState(a.NodeID, ds, full)
		},
		NodeID: a.NodeID, Bundle: trust.Signed,
		Changed: func() { rep.Changed() },
		Event: func(typ string, body any) {
			if err := events.Append(typ, body); err != nil {
				log.Error("recording an event", "type", typ, "err", err)
			}
		}})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if c.Kicker != nil {
		c.Kicker(engine.Kick)
	}
	if tel != nil {
		tel.SetKick(engine.Kick)
	}
	kinds := append([]dispatch.Kind{
		{Name: "agent.ping", Idempotent: true, Run: ping(a, bootID, c.Version, clk)},
		{Name: "agent.converge", Idempotent: true, Run: convergeNow(engine)},
	}, c.Kinds...)
	switch {
	case c.FakeReboot:
		kinds = append(kinds, fakeReboot(cfg.DataDir, bootID, func() { rebooting.Store(true); stopS() }))
	case c.Reboot != nil:
		kinds = append(kinds, hostReboot(cfg.DataDir, bootID, c.Reboot))
	}
	ledger, err := quorum.OpenLedger(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	ic := intentCheck{trust: trust, ledger: ledger, unbatched: cfg.Intent.UnbatchedDestructivePerHour, clk: clk}
	d, err = dispatch.New(dispatch.Config{NodeID: a.NodeID, Journal: j, Kinds: kinds, Clock: clk, Log: nodeLog,
		Verify: ic.Verify, Admit: ic.Admit,
		Attest: func(kind string, r *bcdv1.CommandResult) []byte {
			if !quorum.IsDestructive(kind) {
				return nil
			}
			k, ok := cert.Load().PrivateKey.(crypto.Signer)
			if !ok {
				return nil
			}
			sig, err := intent.AttestResult(k, a.NodeID, kind, r)
			if err != nil {
				log.Error("attesting a result", "command_id", r.GetCommandId(), "err", err)
				return nil
			}
			return sig
		}})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	// The journal is settled before the session can deliver anything.
	if err := d.Recover(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	gateway := cfg.Gateway // where the session goes, as logs and bcd status say
	if ws != nil {
		gateway = cfg.WebSocket.URL
	}
	log.Info("agent starting", "role", c.Role, "site", a.Site, "gateway", gateway, "boot_id", bootID)
	rep = report.New(report.Config{Status: engine.Status, Machine: c.Machine, Now: clk.Now, Log: nodeLog, TrustTaken: trust.Taken,
		Publish: func(r *bcdv1.StatusReport) { s.Report(r) }})
	// welcome takes a newer trust bundle before anything of the session
	// is checked, then reports (acknowledging the bundle once).
	welcome := func(w *bcdv1.Welcome) {
		took, err := trust.Offer(w.GetTrustBundle())
		switch {
		case err != nil:
			log.Error("trust bundle refused; holding the one before", "held_version", trust.Version(), "err", err)
			_ = events.Append("trust_bundle.refused", map[string]any{"version": w.GetTrustBundle().GetVersion(), "held": trust.Version(), "error": err.Error()})
		case took:
			log.Info("trust bundle taken", "version", trust.Version(), "signed_intent", trust.Enforced())
			if why := trust.ApproversRefused(); why != "" {
				log.Error("the bundle's approver set was refused", "err", why)
				_ = events.Append("approvers.refused", map[string]any{"version": trust.Version(), "error": why})
			}
		}
		rep.Welcome(w)
		if c.Welcomed != nil {
			c.Welcomed(sctx)
		}
	}
	hello := func(h *bcdv1.Hello) {
		rep.Hello(h)
		h.TrustBundleVersion = trust.Version()
	}
	jwks := c.Tunnels.JWKS
	if jwks == nil {
		jwks = func() *jose.JSONWebKeySet { return nil }
	}
	tunnels := tunnel.New(tunnel.Config{NodeID: a.NodeID, DataDir: cfg.DataDir, Client: client, JWKS: jwks, Now: clk.Now,
		Epoch:   func() (bool, uint64) { connected, epoch, _ := s.State(); return connected, epoch },
		SSHPort: c.Tunnels.SSHPort, Console: c.Tunnels.Console, Instances: c.Tunnels.Instances, Log: nodeLog.With("component", "tunnel"),
		Event: func(typ string, body any) {
			if err := events.Append(typ, body); err != nil {
				log.Error("recording an event", "type", typ, "err", err)
			}
		}})
	scfg := session.Config{
		Client: client, NodeID: a.NodeID, Role: c.Role, BootID: bootID, Version: c.Version,
		Dispatcher: d, Clock: clk, Log: nodeLog, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
		BeforeDial: hc.CloseIdleConnections, Drivers: c.Drivers, Capabilities: c.Capabilities,
		OnDesiredState: func(ds *bcdv1.DesiredState, serverNow time.Time) { _ = engine.Offer(ds, serverNow) },
		OnWelcome:      welcome, Hello: hello, Heartbeat: rep.Heartbeat, Events: events,
		OnOpenTunnel: func(ot *bcdv1.OpenTunnel) { tunnels.Open(sctx, ot) },
		NodeKey:      func() crypto.Signer { k, _ := cert.Load().PrivateKey.(crypto.Signer); return k },
		VerifyCancel: func(c *bcdv1.Cancel) error { return trust.Roots().VerifyCancel(a.NodeID, c) },
	}
	if ws != nil {
		log.Info("using the WebSocket fallback: no tunnels", "url", cfg.WebSocket.URL)
		scfg.Dial = func(ctx context.Context) (session.Stream, error) {
			st, err := ws.Dial(ctx, cert.Load)
			if err != nil {
				return nil, err
			}
			return st, nil
		}
		scfg.AfterWelcome = func() error {
			if trust.Enforced() {
				return nil
			}
			log.Error(errNoRoots.Error(), "trust_bundle_version", trust.Version())
			return errNoRoots
		}
		scfg.OnOpenTunnel = func(ot *bcdv1.OpenTunnel) {
			log.Warn("tunnel refused: the WebSocket fallback carries no tunnels", "tunnel_id", ot.GetTunnelId())
		}
	}
	s = session.New(scfg)
	if c.ReportSections != nil {
		c.ReportSections(rep.SetSections)
	}
	// The engine, the reporter and the machine's watchers run as long as
	// the agent: the stored spec is enforced with no gateway reachable.
	bctx, stopB := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() { stopB(); bg.Wait() }()
	bg.Add(3)
	if tel != nil {
		bg.Add(1)
		go func() { defer bg.Done(); _ = tel.Run(bctx) }()
	}
	go func() { defer bg.Done(); _ = engine.Run(bctx) }()
	go func() { defer bg.Done(); _ = tunnels.Run(bctx) }()
	go func() { defer bg.Done(); _ = rep.Run(bctx) }()
	startPagesOnce.Do(func() {
		bg.Add(1)
		go func() { defer bg.Done(); dropStartPages(bctx, log) }()
	})
	if c.Watch != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := c.Watch(bctx, rep.Changed); err != nil && bctx.Err() == nil {
				log.Error("machine watcher stopped", "err", err)
			}
		}()
	}
	rctx, stopR := context.WithCancel(ctx)
	rDone := make(chan struct{})
	defer func() { stopR(); <-rDone }()
	go func() {
		defer close(rDone)
		_ = renew.Run(rctx, renew.Config{
			Client: client, DataDir: cfg.DataDir, SigningPin: cfg.JoinSigningKeyPin, Log: nodeLog, After: c.RenewAfter, TPM: c.TPM,
			OnRenewed: func(next *identity.Agent) {
				keyHolder.Store(next.KeyHolder)
				tc := next.TLSCertificate()
				cert.Store(&tc)
				s.Reconnect()
			},
		}, a)
	}()
	// The dispatcher and the session stop together: a dispatcher that
	// cannot start (an unreadable journal) ends the agent.
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		snap := func() status.Snapshot {
			connected, epoch, since := s.State()
			running, queued := d.Jobs()
			evs, _, _ := j.Events()
			leaf := cert.Load().Leaf
			now := clk.Now()
			sn := status.Snapshot{
				NodeID: a.NodeID, Site: a.Site, Role: a.Role, BootID: bootID, Version: c.Version,
				Gateway: gateway, Connected: connected, Epoch: epoch, SessionSince: since,
				ClockOffsetMS: now.Sub(time.Now()).Milliseconds(), TimeMark: clk.Mark(),
				EventBacklog: len(evs), EventsDropped: j.Dropped(), ResultsUnacked: len(d.Unacked()),
				Converge:            statusConverge(engine.Status()),
				SignedIntent:        signedIntent(trust),
				CertificateNotAfter: leaf.NotAfter, CertificateValidFor: status.ValidFor(leaf.NotAfter, now), KeyHolder: keyHolder.Load().(string),
				Running: []status.Job{}, Deferred: []status.Job{}, Lanes: []status.Lane{},
				Tunnels: []status.Tunnel{},
			}
			for _, t := range tunnels.List() {
				sn.Tunnels = append(sn.Tunnels, status.Tunnel(t))
			}
			for _, x := range running {
				sn.Running = append(sn.Running, status.Job{ID: x.ID, Kind: x.Kind, Lane: x.Lane, Started: x.Started})
			}
			for _, x := range queued {
				sn.Deferred = append(sn.Deferred, status.Job{ID: x.ID, Kind: x.Kind, Lane: x.Lane})
			}
			for _, l := range d.Credits() {
				sn.Lanes = append(sn.Lanes, status.Lane{Lane: l.GetLane(), Size: int(l.GetSize()), Free: int(l.GetFree())})
			}
			if c.BootLease != nil {
				held, left := c.BootLease()
				sn.BootLease = &status.BootLease{Held: held, ValidFor: left.Round(time.Second).String()}
			}
			if tel != nil {
				sn.Telemetry = tel.Status()
			}
			if c.StatusGPUs != nil {
				sn.GPUs = c.StatusGPUs(sctx)
			}
			if sn.GPUs == nil {
				sn.GPUs = []status.GPU{}
			}
			if c.StatusHost != nil {
				sn.HostUnits = c.StatusHost()
			}
			if c.StatusTaps != nil {
				sn.Taps = c.StatusTaps()
			}
			if c.StatusInstances != nil {
				var complete bool
				sn.Instances, complete = c.StatusInstances()
				sn.InstancesComplete = &complete
			}
			if c.Machine.Conditions != nil {
				for _, x := range c.Machine.Conditions() {
					sn.Conditions = append(sn.Conditions, status.Condition{Type: x.GetType(), Subject: x.GetSubject(), Message: x.GetMessage(), Since: time.UnixMilli(x.GetSinceUnixMs())})
				}
			}
			return sn
		}
		if err := status.Serve(sctx, cfg.SocketPath, snap, nodeLog); err != nil {
			log.Error("status socket unavailable; running without it", "socket_path", cfg.SocketPath, "err", err)
		}
	}()
	defer func() { stopS(); <-statusDone }()
	dctx, stopD := context.WithCancel(ctx)
	dDone := make(chan error, 1)
	go func() {
		err := d.Run(session.WithSecrets(dctx, s))
		if err != nil {
			stopS()
		}
		dDone <- err
	}()
	err = s.Run(sctx)
	stopD()
	if derr := <-dDone; derr != nil {
		return fmt.Errorf("agent: %w", derr)
	}
	if rebooting.Load() && ctx.Err() == nil {
		log.Info("rebooting (fakehw): the agent starts again with a new boot id")
		return ErrRebooted
	}
	if restarting.Load() && ctx.Err() == nil {
		log.Info("restarting into the new release")
		return ErrRestart
	}
	if errors.Is(err, session.ErrRevoked) {
		log.Error("this node's certificate was revoked")
	}
	return err
}

// errNoRoots ends a session on the WebSocket fallback while the held
// trust bundle names no command-signing root: the proxy in the middle
// could otherwise inject commands and desired state.
var errNoRoots = errors.New("WebSocket fallback refused: the trust bundle names no command-signing roots, so the proxy in the middle could inject commands; add one (bcgw trust add-root) or reach the gateway directly")

// intentCheck is the dispatcher's signed-intent check of a new command:
// Verify checks its signature under the bundle's roots and, for a
// destructive kind while the bundle names approvers, its batch leaf; Admit
// (once every other check passed) spends the leaf in the ledger, or a
// place within the unbatched limit per hour, before the command can run.
type intentCheck struct {
	trust     *bundle.Held
	ledger    *quorum.Ledger
	unbatched int
	clk       *clock.Clock
}

func (ic intentCheck) gated(cmd *bcdv1.Command) bool {
	return ic.trust.Approvers() != nil && quorum.IsDestructive(cmd.GetKind())
}

// now is the later of the working clock and the host's: a gateway can
// hold the working clock back, never the host's, so a batch expires.
func (ic intentCheck) now() time.Time {
	if n := time.Now(); n.After(ic.clk.Now()) {
		return n
	}
	return ic.clk.Now()
}

func (ic intentCheck) leaf(cmd *bcdv1.Command) (quorum.Verified, error) {
	set, err := ic.trust.Approvers().Set()
	if err != nil {
		return quorum.Verified{}, fmt.Errorf("%w: the held approver set: %v", quorum.ErrUnapproved, err)
	}
	return quorum.Verify(cmd, set, ic.now())
}

func (ic intentCheck) Verify(cmd *bcdv1.Command) error {
	if err := ic.trust.Roots().VerifyCommand(cmd); err != nil {
		return err
	}
	if !ic.gated(cmd) || cmd.GetBatch() == nil && ic.unbatched > 0 {
		return nil
	}
	_, err := ic.leaf(cmd)
	return err
}

func (ic intentCheck) Admit(cmd *bcdv1.Command) (func(), error) {
	if !ic.gated(cmd) {
		return nil, nil
	}
	if cmd.GetBatch() == nil {
		// The host clock: a gateway cannot move it to free places.
		return nil, ic.ledger.Unbatched(ic.unbatched, time.Now())
	}
	v, err := ic.leaf(cmd)
	if err != nil {
		return nil, err
	}
	if err := ic.ledger.Spend(v, cmd.GetId(), time.Now()); err != nil {
		return nil, err
	}
	return func() { _ = ic.ledger.Release(v, cmd.GetId()) }, nil
}

// convergeNow is the shared kind agent.converge: a pass now (the
// periodic one runs every 10 minutes), answered with the status after it.
func convergeNow(e *converge.Engine) func(context.Context, []byte) (json.RawMessage, error) {
	return func(ctx context.Context, _ []byte) (json.RawMessage, error) {
		e.Pass(ctx)
		return json.Marshal(e.Status())
	}
}

// signedIntent is the held trust bundle as bcd status shows it.
func signedIntent(trust *bundle.Held) status.SignedIntent {
	si := status.SignedIntent{TrustBundleVersion: trust.Version(), Enforced: trust.Enforced(), Roots: trust.Roots().Len(),
		ApproversRefused: trust.ApproversRefused()}
	if a := trust.Approvers(); a != nil {
		si.Approvers = &status.Approvers{Epoch: a.Epoch, Threshold: a.Threshold, Keys: len(a.Keys)}
	}
	return si
}

// statusConverge is the engine's status as bcd status shows it.
func statusConverge(st converge.Status) status.Converge {
	out := status.Converge{Applied: st.Applied, Observed: st.Observed, SpecError: st.SpecError,
		RefusedGeneration: st.RefusedGeneration, Sections: []status.Section{}}
	for _, x := range st.Sections {
		out.Sections = append(out.Sections, status.Section{Name: x.Name, State: x.State, Generation: x.Generation,
			Message: x.Message, Changes: x.Changes, Since: x.Since, Attempts: x.Attempts})
	}
	return out
}

// ping is the shared kind agent.ping: who answered, from which boot.
func ping(a *identity.Agent, bootID, version string, clk *clock.Clock) func(context.Context, []byte) (json.RawMessage, error) {
	return func(ctx context.Context, body []byte) (json.RawMessage, error) {
		return json.Marshal(map[string]any{
			"node_id": a.NodeID, "site": a.Site, "role": a.Role, "boot_id": bootID,
			"version": version, "time": clk.Now().UTC().Format(time.RFC3339Nano),
		})
	}
}

// startPagesAfter is when the agent's start is over: its first session,
// report and converge pass done.
const startPagesAfter = 20 * time.Second

// startPagesOnce gives the start's pages back once per process, however
// many agents it runs (bcd sim runs one per machine).
var startPagesOnce sync.Once

// dropStartPages gives back, once the start is over, the pages of the
// binary's code and read-only data that only the start touched
// (components/agent/resident): an idle agent then keeps mapped only what
// it runs (docs/decisions.md).
func dropStartPages(ctx context.Context, log *slog.Logger) {
	t := time.NewTimer(startPagesAfter)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	if n, err := resident.Drop(); err != nil {
		log.Warn("could not give back the start's code pages", "err", err)
	} else {
		log.Debug("gave back the start's code pages", "bytes_spanned", n)
	}
}
