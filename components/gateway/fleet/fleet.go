package fleet

import (
	"context"
	"crypto"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/metrics"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/pki"
)

// Config is what the fleet logic needs of a gateway's settings.
type Config struct {
	DataDir    string
	Database   string // the PostgreSQL URL, "" on bbolt (health.go names it)
	ServerName string
	// Name is this gateway's name among several on one database.
	Name      string
	LeaseTTL  time.Duration // boot lease lifetime without renewal
	Heartbeat time.Duration // the agents' heartbeat interval
	// KEK is the fleet's key-encryption key on a database (nil on
	// bbolt): operator secrets are sealed under it (opsecrets.go).
	KEK *kek.KEK
	// KeyStore is where a database keeps the key set sealed under KEK
	// (nil on bbolt): a gateway checks it still is (reseal.go).
	KeyStore store.KeyStore
	// Backup writes a consistent copy of a bbolt store (nil on a
	// database, which pg_dump backs up).
	Backup func(io.Writer) (int64, error)
	// Metrics is where the gateway's metrics are counted (nil: nowhere).
	Metrics *metrics.Metrics
}

// Fleet is the fleet logic of one gateway: its store and keys, the
// commands, specs, holds, trust bundle, releases and provisioning, and
// the notices it shares with the other gateways on its database. It
// reaches the agents only through the hub's live sessions.
type Fleet struct {
	cfg   Config
	log   *slog.Logger
	store store.Store
	// shared is the store as several gateways share it (nil on bbolt):
	// notices and leases across them (shared.go).
	shared store.Shared
	keys   *keys.Set
	// keyFiles is where the long-lived keys are: the data directory, or
	// the key set unsealed from the database (package keys).
	keyFiles keys.Files
	// cmdKey is bcgw's own command-signing key (nil without one); trust
	// is the trust bundle Welcome carries (trust.go).
	cmdKey   crypto.Signer
	cmdKeyMu sync.RWMutex // guards cmdKey and cmdKeyVersion, which a rotation replaces (rotate.go)
	// cmdKeyVersion is the stored version of cmdKey on a database, 0 when
	// cmdKey is not the key set's (on bbolt, --command-key FILE or none).
	cmdKeyVersion uint32
	// rotateMu serializes this gateway's rotations and its loads of a key
	// rotated through another gateway (rotate.go).
	rotateMu sync.Mutex
	trust    trustState
	hub      *hub.Hub
	leases   *leases
	now      func() time.Time
	progress progressBook // running commands' latest progress (progress.go)
	// specLocks serializes each node's desired spec changes (spec.go).
	specLocks keyedMutex
	// access holds the SSH user CA and the exec-ticket key (access.go).
	access accessKeys
	// health is whether the database answers (health.go).
	health dbHealth
	// onSweep runs at each sweep of the shared store (OnSweep).
	onSweep []func()
	// catchingUp is set while catchUp runs after the notices' listener
	// (re)connected; the sweep leaves the trust bundle to it (shared.go).
	catchingUp atomic.Bool

	// secretsMu guards secretsKey, the bbolt gateway's key for operator
	// secrets once read or made (opsecrets.go).
	secretsMu  sync.Mutex
	secretsKey *kek.KEK

	mu      sync.Mutex
	waiters map[string][]chan struct{} // command id -> admin calls waiting for its result
}

// New is the fleet logic over an open store, with the gateway's keys and
// its command-signing key (nil: none); it loads the trust bundle and
// brings the store's records up to date.
func New(cfg Config, log *slog.Logger, st store.Store, h *hub.Hub, k *keys.Set, kf keys.Files, cmdKey crypto.Signer) (*Fleet, error) {
	s := &Fleet{cfg: cfg, log: log, store: st, keys: k, keyFiles: kf, cmdKey: cmdKey, hub: h, leases: newLeases(cfg.LeaseTTL), now: time.Now}
	s.startHealth()
	if sh, ok := st.(store.Shared); ok {
		s.shared, s.leases.shared = sh, sh
	}
	if err := s.loadSharedCommandKey(); err != nil {
		return nil, err
	}
	if err := s.loadTrust(); err != nil {
		return nil, err
	}
	if err := s.upgradeStore(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}

// Store gives the tests and the admin API the store (bbolt or PostgreSQL).
func (s *Fleet) Store() store.Store { return s.store }

// Metrics is where the gateway's metrics are counted (nil counts nothing).
func (s *Fleet) Metrics() *metrics.Metrics { return s.cfg.Metrics }

// Log is the gateway's logger.
func (s *Fleet) Log() *slog.Logger { return s.log }

// Now is the gateway's clock.
func (s *Fleet) Now() time.Time { return s.now() }

// Shared is the store as several gateways share it, nil on bbolt.
func (s *Fleet) Shared() store.Shared { return s.shared }

// Keys are the gateway's long-lived keys.
func (s *Fleet) Keys() *keys.Set { return s.keys }

// OnSweep adds f to what each sweep of the shared store runs.
func (s *Fleet) OnSweep(f func()) { s.onSweep = append(s.onSweep, f) }

// Name is this gateway's name among several on one database.
func (s *Fleet) Name() string { return s.cfg.Name }

// Run starts the fleet's background work until ctx ends: handing on
// lapsed boot leases, checking the database's health, and on a shared
// database the notices and the sweep.
func (s *Fleet) Run(ctx context.Context) {
	go every(ctx, s.leases.ttl/3, s.handLapsedLeases)
	go every(ctx, healthEvery, func() { s.checkDatabase(ctx) }) // the database's health (health.go)
	if s.shared != nil {
		go s.sharedLoop(ctx)
	}
}

// LockSpec holds the node's spec lock until the returned function is
// called: no spec change of the node is pushed meanwhile (spec.go).
func (s *Fleet) LockSpec(node string) (unlock func()) { return s.specLocks.lock(node) }

// BootLeaseHolder is the site agent holding its site's boot lease, "" for none.
func (s *Fleet) BootLeaseHolder(site string) string { return s.leases.holder(site, s.now()) }

// DatabaseReachable is whether the database answered its last check.
func (s *Fleet) DatabaseReachable() bool {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.Reachable
}

// SetHealthEvery shortens how often the database is pinged (tests); the
// returned function puts it back.
func SetHealthEvery(d time.Duration) func() {
	old := healthEvery
	healthEvery = d
	return func() { healthEvery = old }
}

// SetDrainLostAfter changes how long the database stays unreachable before
// the gateway drains its sessions (tests); the returned function puts it
// back.
func SetDrainLostAfter(d time.Duration) func() {
	old := drainLostAfter
	drainLostAfter = d
	return func() { drainLostAfter = old }
}

// KeyFiles is the gateway's key set by file name, as it uses it: from
// the database (unsealed) or from the data directory (tests).
func (s *Fleet) KeyFiles() map[string][]byte {
	out := map[string][]byte{}
	for _, name := range keys.SharedFiles {
		if b, err := s.keyFiles.Read(name); err == nil {
			out[name] = b
		}
	}
	if k, v := s.commandKeyVersion(); v > 0 {
		// Rotated since the set was read at the start.
		out[keys.CommandKeyFile], _ = pki.MarshalPrivateKeyPEM(k)
	}
	return out
}

// NoteUpgrade records c as its node's upgrade, as if it had just been
// sent (tests).
func (s *Fleet) NoteUpgrade(c store.Command) { s.noteUpgrade(c) }
