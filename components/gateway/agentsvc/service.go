package agentsvc

import (
	"crypto/x509"
	"log/slog"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/wsproof"
)

// Config is what the agent service needs of a gateway's settings.
type Config struct {
	TrustDomain  string        // SPIFFE trust domain of the node certificates
	Name         string        // this gateway's name among several on one database
	CertValidity time.Duration // node certificates
	Heartbeat    time.Duration // heartbeat interval asked of agents
	MaxSessions  int           // live sessions beyond this are refused busy; 0 = unlimited
	Pushback     time.Duration // the retry pushback a busy refusal carries
	JoinRate     float64       // joins a second admitted (joinlimit.go)
	SetupSlots   int           // session set-ups at once (setup.go); 0: DefaultSetupSlots
	// CloudIIDCerts are the certificates EC2 identity documents must verify
	// under (AWS's published ones, or a test's); none: cloud-iid is refused.
	CloudIIDCerts []*x509.Certificate
	// CloudIIDMaxAge is how long after launch an instance may join with
	// cloud-iid (0: DefaultCloudIIDMaxAge; below 0: no limit).
	CloudIIDMaxAge time.Duration
}

// Service is the AgentGateway service of one gateway over its fleet
// logic: Join, Renew, Session and Tunnel.
type Service struct {
	*fleet.Fleet
	cfg    Config
	log    *slog.Logger
	store  store.Store
	shared store.Shared // the store as several gateways share it, nil on bbolt
	keys   *keys.Set
	hub    *hub.Hub
	now    func() time.Time
	tpm    tpmChallenges // the tpm attestor's open challenges (tpm.go)
	// tunnels are the tunnels waiting for their node (tunnel.go).
	tunnels tunnelBook
	// joins limits the rate of Join (joinlimit.go).
	joins *joinLimiter
	// ws issues the WebSocket fallback's challenges (websocket.go).
	ws     *wsproof.Issuer
	wsOnce sync.Once
	// setups admits a few session set-ups at a time (setup.go).
	setups *setupGate
	// cloudMu admits one cloud-iid join at a time (cloudiid.go).
	cloudMu sync.Mutex
}

// New is the agent service over fl, whose sessions h registers.
func New(cfg Config, fl *fleet.Fleet, h *hub.Hub) *Service {
	s := &Service{Fleet: fl, cfg: cfg, log: fl.Log(), store: fl.Store(), shared: fl.Shared(), keys: fl.Keys(), hub: h, now: time.Now}
	s.setups = newSetupGate(cfg.SetupSlots, setupQueueMax)
	s.joins = newJoinLimiter(joinRate(cfg.JoinRate), DefaultJoinBurst, time.Now)
	fl.OnSweep(s.pruneTPMChallenges)
	return s
}
