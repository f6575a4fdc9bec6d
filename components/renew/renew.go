// Package renew keeps an agent's certificate fresh: at 60% of its lifetime
// it makes a new key, proves possession of the current one (a
// purpose-framed signature over the new CSR), calls Renew over mTLS,
// verifies the signed answer like a join's, and stores the new identity.
package renew

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/backoff"
	"github.com/better-compute/bcd/components/identity"
	"github.com/better-compute/bcd/components/join"
	"github.com/better-compute/bcd/components/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// Fraction of the certificate's lifetime after which it is renewed.
const Fraction = 0.6

// Config configures the renewer.
type Config struct {
	Client     bcdv1connect.AgentGatewayClient
	DataDir    string
	SigningPin string // join_signing_key_pin
	Log        *slog.Logger
	// After, when set, renews this long after start instead of at 60% of
	// the lifetime (BCD_RENEW_AFTER in fakehw builds), then at 60%.
	After time.Duration
	// OnRenewed is told each new identity (the agent swaps its client
	// certificate and redials).
	OnRenewed func(*identity.Agent)
	Now       func() time.Time
}

// Due returns when a certificate should be renewed.
func Due(c interface{ Bounds() (time.Time, time.Time) }) time.Time {
	nb, na := c.Bounds()
	return nb.Add(time.Duration(float64(na.Sub(nb)) * Fraction))
}

type bounds struct{ nb, na time.Time }

func (b bounds) Bounds() (time.Time, time.Time) { return b.nb, b.na }

// Run renews cur whenever it is due until ctx ends.
func Run(ctx context.Context, cfg Config, cur *identity.Agent) error {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	log := cfg.Log.With("component", "renew")
	first := true
	for {
		due := Due(bounds{cur.Cert.NotBefore, cur.Cert.NotAfter})
		if first && cfg.After > 0 {
			due = cfg.Now().Add(cfg.After)
		}
		first = false
		if err := backoff.Sleep(ctx, time.Until(due)); err != nil {
			return nil
		}
		for attempt := 0; ; attempt++ {
			next, err := Once(ctx, cfg, cur)
			if err == nil {
				log.Info("certificate renewed", "not_after", next.Cert.NotAfter.UTC())
				cur = next
				if cfg.OnRenewed != nil {
					cfg.OnRenewed(next)
				}
				break
			}
			wait := backoff.Full(attempt, time.Second, 5*time.Minute)
			if p, ok := backoff.Pushback(err); ok {
				wait = p
			}
			lvl := slog.LevelWarn
			if cfg.Now().Add(wait).After(cur.Cert.NotAfter) {
				lvl = slog.LevelError
			}
			log.Log(ctx, lvl, "certificate renewal failed; retrying", "err", err, "retry_in", wait.String(), "not_after", cur.Cert.NotAfter.UTC())
			if backoff.Sleep(ctx, wait) != nil {
				return nil
			}
		}
	}
}

// Once renews cur now and stores the new identity.
func Once(ctx context.Context, cfg Config, cur *identity.Agent) (*identity.Agent, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	csr, err := pki.CreateCSR(key, cur.NodeID)
	if err != nil {
		return nil, err
	}
	proof, err := pki.Sign(cur.Key, pki.PurposeRenew, csr)
	if err != nil {
		return nil, fmt.Errorf("sign renewal proof: %w", err)
	}
	resp, err := cfg.Client.Renew(ctx, connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: proof}))
	if err != nil {
		return nil, fmt.Errorf("Renew: %w", err)
	}
	res, cert, err := join.VerifyResponse(resp.Msg, cfg.SigningPin, csr, key.Public(), cur.Role)
	if err != nil {
		return nil, err
	}
	if res.GetNodeId() != cur.NodeID {
		return nil, fmt.Errorf("Renew answered for node %s, not %s", res.GetNodeId(), cur.NodeID)
	}
	id := cur.Identity
	return identity.Save(cfg.DataDir, key, cert, id)
}
