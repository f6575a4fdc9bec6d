package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/sdnotify"
	"github.com/better-compute/bcd/components/gateway/admin"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/metrics"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wellknown"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// Config configures a Server.
type Config struct {
	DataDir string
	// Database, when set, is the PostgreSQL URL of the store (store.go);
	// without it the store is the bbolt file DataDir/bcgw.db.
	Database    string
	Listen      string // host:port of the AgentGateway and well-known listener
	URL         string // gateway URL published in the well-known document; default https://Listen
	ServerName  string // TLS name of the serving certificate; default bcgw.lab
	TrustDomain string // SPIFFE trust domain; default bcgw.lab
	// Name is this gateway's name among several on one database, stored
	// with each session it holds (store.Node.Gateway); default
	// HOSTNAME:DATA-DIR.
	Name string
	// AdminListen, when set, also serves the admin API on this loopback
	// address with the bearer token in DataDir/admin.token.
	AdminListen string
	MaxSessions int           // live sessions beyond this are refused busy; 0 = unlimited
	LeaseTTL    time.Duration // boot lease lifetime without renewal; default 45s
	Pushback    time.Duration // the retry pushback a busy refusal carries
	JoinRate    float64       // joins a second admitted (joinlimit.go); 0: DefaultJoinRate, below 0: no limit
	// CloudIIDCerts and CloudIIDMaxAge: the cloud-iid attestor's pinned
	// certificates and the maximum age of an instance that joins with it.
	CloudIIDCerts  []*x509.Certificate
	CloudIIDMaxAge time.Duration
	CertValidity   time.Duration // node certificates; default 24h
	Heartbeat      time.Duration // heartbeat interval asked of agents; default 15s
	// CommandKey is bcgw's own command-signing key: "" for
	// DataDir/command-signing.key (made at first start), CommandKeyNone
	// for none (bcgw then signs nothing), or the path of a PEM key file.
	CommandKey string
	// KEKFile is the key-encryption key's file (bcgw kek generate), which
	// a gateway on a database (Database set) must have: the fleet's keys
	// are stored there sealed under it (package keys). Unused on bbolt.
	KEKFile string
	// MetricsListen, when set, serves bcgw's own metrics in the
	// Prometheus text format at /metrics on this address: a bare port is
	// on loopback (metrics.go; docs/bcgw.md, "Metrics").
	MetricsListen string
	// Profile also serves Go's profiles and execution trace at
	// /debug/pprof/ on the metrics listener, and records blocking and
	// lock contention for them (profile.go).
	Profile bool
	// HealthListen, when set, serves GET /readyz in plain HTTP on this
	// address for the balancer's health check, which then never waits
	// behind the agents' TLS handshakes (readyz.go).
	HealthListen string
	Log          *slog.Logger
	// boundAside, when set, sees the admin socket where it is bound,
	// before it gets its mode and its place (tests).
	boundAside func(path string)
	// beforeKeySet, when set, runs when the database has no key set yet,
	// before this gateway offers one (tests).
	beforeKeySet func()
}

// Server is a running bcgw: the fleet logic (package fleet, whose methods
// it carries), the agent service and the admin API over it.
type Server struct {
	*fleet.Fleet
	svc   *agentsvc.Service
	admin *admin.API
	cfg   Config
	log   *slog.Logger
	store store.Store
	keys  *keys.Set
	hub   *hub.Hub
	// metrics are this gateway's own (metrics.go).
	metrics *metrics.Metrics

	// servingMu guards keys.Serving, renewed while serving (serving.go);
	// servingIPs are the IPs the leaf names.
	servingMu  sync.Mutex
	servingIPs []net.IP

	mu          sync.Mutex
	addr        net.Addr
	metricsAddr net.Addr
	healthAddr  net.Addr
}

// New opens the data directory, making the keys on first start.
func New(cfg Config) (*Server, error) { return NewContext(context.Background(), cfg) }

// NewContext is New that gives up when ctx ends (a database that is not
// reachable yet is waited for).
func NewContext(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("gateway: --data-dir is required")
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "bcgw.lab"
	}
	if cfg.Name == "" {
		cfg.Name = defaultName(cfg.DataDir)
	}
	if cfg.TrustDomain == "" {
		cfg.TrustDomain = "bcgw.lab"
	}
	if cfg.CertValidity == 0 {
		cfg.CertValidity = 24 * time.Hour
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.Pushback == 0 {
		cfg.Pushback = 2 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := privateDir(cfg.DataDir, cfg.Log); err != nil {
		return nil, err
	}
	var kk *kek.KEK
	switch {
	case cfg.Database != "" && cfg.KEKFile == "":
		return nil, fmt.Errorf("gateway: %w", keys.ErrNoKEK)
	case cfg.Database != "":
		var err error
		if kk, err = kek.ReadFile(cfg.KEKFile); err != nil {
			return nil, fmt.Errorf("gateway: --key-encryption-key: %w", err)
		}
	case cfg.KEKFile != "":
		cfg.Log.Info("the key-encryption key is not used: without a database the keys are files in the data directory", "data_dir", cfg.DataDir)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var kf keys.Files = keys.Dir(cfg.DataDir)
	if ks, ok := st.(store.KeyStore); ok && kk != nil {
		set, err := keys.Shared(ks, kk, cfg.DataDir, cfg.Log, cfg.beforeKeySet)
		if err != nil {
			st.Close()
			return nil, fmt.Errorf("gateway: keys: %w", err)
		}
		kf = set
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	if h, _, err := net.SplitHostPort(cfg.Listen); err == nil {
		if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
			ips = append(ips, ip)
		}
	}
	k, err := keys.LoadOrCreate(kf, cfg.ServerName, ips)
	if err != nil {
		st.Close()
		return nil, err
	}
	ck, err := fleet.LoadCommandKey(kf, cfg.CommandKey)
	if err != nil {
		st.Close()
		return nil, err
	}
	h := hub.New()
	var fl *fleet.Fleet
	gauges := metrics.Gauges{Sessions: h.Count, DatabaseUp: func() bool { return fl.Health().Database.Reachable }}
	setupSlots := 0 // agentsvc's default
	pg, onPG := st.(*pgstore.PG)
	if onPG {
		gauges.PoolWaits = func() (int64, time.Duration) { s := pg.PoolStats(); return s.Waits, s.WaitTime }
		// Half the pool for new sessions' set-ups, half for the live ones.
		setupSlots = max(2, int(pg.PoolStats().Max)/2)
	}
	m := metrics.New(cfg.Name, gauges)
	keyStore, _ := st.(store.KeyStore) // the timed store below is not one
	var backup func(io.Writer) (int64, error)
	if b, ok := st.(*store.Bolt); ok {
		backup = b.Backup
	}
	st = store.Timed(st, m.StoreOp)
	fl, err = fleet.New(fleet.Config{
		DataDir: cfg.DataDir, Database: cfg.Database, ServerName: cfg.ServerName, Name: cfg.Name,
		LeaseTTL: cfg.LeaseTTL, Heartbeat: cfg.Heartbeat, KEK: kk, KeyStore: keyStore, Backup: backup, Metrics: m,
	}, cfg.Log, st, h, k, kf, ck)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if onPG {
		pg.OnNoticeUnsent(fl.NoticeUnsent)
	}
	svc := agentsvc.New(agentsvc.Config{
		TrustDomain: cfg.TrustDomain, Name: cfg.Name, CertValidity: cfg.CertValidity, Heartbeat: cfg.Heartbeat,
		MaxSessions: cfg.MaxSessions, Pushback: cfg.Pushback, JoinRate: cfg.JoinRate, SetupSlots: setupSlots,
		CloudIIDCerts: cfg.CloudIIDCerts, CloudIIDMaxAge: cfg.CloudIIDMaxAge,
	}, fl, h)
	s := &Server{Fleet: fl, svc: svc, cfg: cfg, log: cfg.Log, store: st, keys: k, hub: h, metrics: m, servingIPs: ips}
	s.admin = admin.New(admin.Config{DataDir: cfg.DataDir, AdminListen: cfg.AdminListen, BoundAside: cfg.boundAside, WellKnown: s.WellKnown,
		RenewServing: s.RenewServing}, fl, svc)
	return s, nil
}

// AdminURL is the loopback admin address when --admin-listen is set.
func (s *Server) AdminURL() string { return s.admin.AdminURL() }

// Addr is the bound AgentGateway address once Run has started listening.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

func (s *Server) gatewayURL() (string, error) {
	if s.cfg.URL != "" {
		return s.cfg.URL, nil
	}
	a := s.Addr()
	if a == nil {
		return "", errors.New("gateway: not listening yet and no --url given")
	}
	return "https://" + a.String(), nil
}

// WellKnown returns the document served at /.well-known/better-compute.
func (s *Server) WellKnown() (*wellknown.Document, error) {
	gwURL, err := s.gatewayURL()
	if err != nil {
		return nil, err
	}
	serving, signing, enc, err := s.keys.Pins()
	if err != nil {
		return nil, err
	}
	pub := pki.PublicJWK(s.keys.EncJWK)
	jb, err := json.Marshal(pub)
	if err != nil {
		return nil, err
	}
	return &wellknown.Document{
		Gateway: wellknown.Gateway{URL: gwURL, ServerName: s.cfg.ServerName},
		Pins:    wellknown.Pins{ServingCA: serving, JoinSigning: signing, JoinEncryption: enc},
		Join:    wellknown.Join{EncryptionJWK: jb},
	}, nil
}

// Run serves until ctx ends, then drains live sessions and returns.
func (s *Server) Run(ctx context.Context) error {
	defer s.store.Close()
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()

	mux := http.NewServeMux()
	path, h := bcdv1connect.NewAgentGatewayHandler(metered{s.svc, s.metrics}, connect.WithReadMaxBytes(5<<20))
	mux.Handle(path, h)
	mux.HandleFunc("GET "+wellknown.Path, func(w http.ResponseWriter, r *http.Request) {
		d, err := s.WellKnown()
		if err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(d)
	})
	mux.HandleFunc("GET "+adminapi.ReleasePath+"{sha256}", s.ServeRelease)
	mux.HandleFunc("GET "+adminapi.ReadyPath, s.svc.ServeReady)
	// The WebSocket fallback for agents behind a proxy that strips client
	// certificates (docs/protocol.md#the-websocket-fallback).
	mux.HandleFunc("GET "+agentsvc.SessionPath, s.svc.ServeWebSocket)
	mux.HandleFunc("GET "+agentsvc.ChallengePath, s.svc.ServeChallenge)
	mux.HandleFunc("POST "+agentsvc.RenewPath, s.svc.ServeRenew)
	withPeer := agentsvc.WithPeer(mux)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	srv := &http.Server{
		Handler:           withPeer,
		TLSConfig:         s.serverTLS(),
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    8 << 10,
		HTTP2:             &http.HTTP2Config{SendPingTimeout: 20 * time.Second, PingTimeout: 15 * time.Second},
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	adminSrv, adminLns, err := s.admin.Listeners()
	if err != nil {
		ln.Close()
		return err
	}
	metricsSrv, metricsLn, err := s.listenMetrics()
	if err != nil {
		ln.Close()
		for _, al := range adminLns {
			al.Close()
		}
		return err
	}
	healthSrv, healthLn, err := s.listenHealth()
	if err != nil {
		ln.Close()
		for _, al := range adminLns {
			al.Close()
		}
		if metricsLn != nil {
			metricsLn.Close()
		}
		return err
	}
	errc := make(chan error, 3+len(adminLns))
	go s.renewServing(ctx)
	go func() {
		errc <- srv.Serve(agentsvc.NewHandshakeListener(ln, srv.TLSConfig, agentsvc.HandshakeSlots(), s.log,
			func() { s.metrics.SessionRefused("handshake_queue") }))
	}()
	for _, al := range adminLns {
		go func() { errc <- adminSrv.Serve(al) }()
	}
	if metricsSrv != nil {
		go func() { errc <- metricsSrv.Serve(metricsLn) }()
		defer metricsSrv.Close()
	}
	if healthSrv != nil {
		go func() { errc <- healthSrv.Serve(healthLn) }()
		defer healthSrv.Close()
	}
	lctx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	s.Fleet.Run(lctx)
	s.log.Info("bcgw serving", "addr", ln.Addr().String(), "server_name", s.cfg.ServerName, "data_dir", s.cfg.DataDir,
		"admin_socket", filepath.Join(s.cfg.DataDir, adminapi.AdminSocket), "admin_url", s.AdminURL(), "metrics_addr", addrString(s.MetricsAddr()),
		"health_addr", addrString(s.HealthAddr()))
	// Under bcgw.service (Type=notify) the unit's start finishes here:
	// the listeners are bound and the store and keys are loaded.
	if err := sdnotify.Ready(); err != nil {
		s.log.Warn("telling systemd bcgw is ready", "err", err)
	}

	select {
	case <-ctx.Done():
	case err = <-errc:
		s.log.Error("serve failed", "err", err)
	}
	_ = sdnotify.Stopping()
	// Drain: ask every agent to redial (another gateway, or this one after a
	// restart), give the frames a moment to go out, then stop.
	n := s.hub.DrainAll("gateway shutting down")
	s.log.Info("draining sessions", "sessions", n)
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = adminSrv.Shutdown(sctx)
	if err2 := srv.Shutdown(sctx); err2 != nil {
		srv.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// defaultName is a gateway's name when it is given none: its host and its
// data directory, which is where its admin socket lives (bcgw --data-dir).
func defaultName(dataDir string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	return host + ":" + dataDir
}

// Name is this gateway's name among several on one database.
func (s *Server) Name() string { return s.cfg.Name }

// privateDir makes dir, or tightens an existing one, to mode 0700: it
// holds the CA key, the store and the admin socket.
func privateDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat %s: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("data directory %s is not a directory", dir)
	}
	if st.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("data directory %s has mode %v and cannot be made 0700 (chmod 700 it, as its owner): %w", dir, st.Mode().Perm(), err)
		}
		log.Warn("bcgw: data directory tightened to 0700", "dir", dir, "was", st.Mode().Perm().String())
	}
	return nil
}
