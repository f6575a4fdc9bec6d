// Package agent is what every agent role runs (node, site, ramdisk): it
// loads the joined identity, dials the gateway with mTLS and runs the
// session with the role's table of command kinds.
package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/better-compute/bcd/components/clock"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/hostinfo"
	"github.com/better-compute/bcd/components/identity"
	"github.com/better-compute/bcd/components/session"
	"github.com/better-compute/bcd/components/transport"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Kind runs one command kind: the body in, a JSON output or an error out.
type Kind func(ctx context.Context, body []byte) (json.RawMessage, error)

// Config configures an agent.
type Config struct {
	Config  *config.Config
	Role    string
	Kinds   map[string]Kind
	Version string
	Log     *slog.Logger
	// BackoffBase and BackoffMax shape redials (defaults 1 s and 1 min).
	BackoffBase, BackoffMax time.Duration
}

// ErrUnsupported is the error text of a kind this role does not run.
const statusUnsupported = "UNSUPPORTED"

// Run runs the agent until ctx ends (nil) or the node is revoked.
func Run(ctx context.Context, c Config) error {
	cfg := c.Config
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	a, err := identity.Load(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
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
	cert := a.TLSCertificate()
	client, hc, err := transport.Client(transport.Options{
		URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin,
		ClientCert: func() (*tls.Certificate, error) { return &cert, nil },
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer hc.CloseIdleConnections()
	kinds := map[string]Kind{"agent.ping": ping(a, bootID, c.Version, clk)}
	for k, f := range c.Kinds {
		kinds[k] = f
	}
	log.Info("agent starting", "role", c.Role, "site", a.Site, "gateway", cfg.Gateway, "boot_id", bootID)
	s := session.New(session.Config{
		Client: client, NodeID: a.NodeID, Role: c.Role, BootID: bootID, Version: c.Version,
		Runner: table(kinds), Clock: clk, Log: nodeLog, BackoffBase: c.BackoffBase, BackoffMax: c.BackoffMax,
	})
	err = s.Run(ctx)
	if errors.Is(err, session.ErrRevoked) {
		log.Error("this node's certificate was revoked")
	}
	return err
}

// table runs kinds from a map; anything else is UNSUPPORTED.
type table map[string]Kind

func (t table) Kinds() []string {
	out := make([]string, 0, len(t))
	for k := range t {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (t table) Run(ctx context.Context, c *bcdv1.Command) *bcdv1.CommandResult {
	f, ok := t[c.GetKind()]
	if !ok {
		return &bcdv1.CommandResult{Status: statusUnsupported, Error: fmt.Sprintf("kind %q is not supported by this agent", c.GetKind())}
	}
	out, err := f(ctx, c.GetBody())
	if err != nil {
		return &bcdv1.CommandResult{Status: "FAILED", Error: err.Error(), Output: out}
	}
	return &bcdv1.CommandResult{Status: "SUCCEEDED", Output: out}
}

// ping is the shared kind agent.ping: who answered, from which boot.
func ping(a *identity.Agent, bootID, version string, clk *clock.Clock) Kind {
	return func(ctx context.Context, body []byte) (json.RawMessage, error) {
		return json.Marshal(map[string]any{
			"node_id": a.NodeID, "site": a.Site, "role": a.Role, "boot_id": bootID,
			"version": version, "time": clk.Now().UTC().Format(time.RFC3339Nano),
		})
	}
}
