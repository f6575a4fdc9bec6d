// Package renew keeps an agent's certificate fresh: at 60% of its lifetime
// it makes a new key, proves possession of the current one (a
// purpose-framed signature over the new CSR), calls Renew over mTLS,
// verifies the signed answer like a join's, and stores the new identity.
//
// With a usable TPM the new key is made in the TPM, so a file key moves
// into it at the next renewal. A node whose certificate names an AK (a tpm
// join) has the AK certify the new key over sha256(csr), or the renewal
// fails.
package renew

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/base/backoff"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
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
	// TPM, when set, is the host's usable TPM: the next key is made in it.
	// A node whose key is in the TPM or whose certificate names an AK
	// cannot renew without it.
	TPM TPM
}

// TPM is what renewal needs of the host's TPM (components/trust/tpm/nodetpm).
type TPM interface {
	identity.TPM
	// NewNodeKey makes a node key under a new unique.
	NewNodeKey() (crypto.Signer, error)
	// AKPublic answers the AK's TPMT_PUBLIC.
	AKPublic() ([]byte, error)
	// Certify has the AK certify key over qualifyingData: the key's
	// TPMT_PUBLIC, the TPMS_ATTEST and the AK's TPMT_SIGNATURE.
	Certify(key crypto.Signer, qualifyingData [32]byte) (keyPub, attest, sig []byte, err error)
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
	akName, err := identity.CertAK(cur.Cert)
	if err != nil {
		return nil, err
	}
	key, err := nextKey(cfg, cur, akName != nil)
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
	req := &bcdv1.RenewRequest{Csr: csr, Proof: proof}
	if akName != nil {
		if req.Certification, err = certify(cfg.TPM, key, akName, csr); err != nil {
			return nil, err
		}
	}
	resp, err := cfg.Client.Renew(ctx, connect.NewRequest(req))
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
	if got, err := identity.CertAK(cert); err != nil || !bytes.Equal(got, akName) {
		return nil, errors.New("Renew answered a certificate that does not name this node's AK as the current one does")
	}
	id := cur.Identity
	next, err := identity.Save(cfg.DataDir, key, cert, id)
	if err == nil && cur.KeyHolder == identity.KeyInFile && next.KeyHolder == identity.KeyInTPM && cfg.Log != nil {
		cfg.Log.Info("the node key moved into the TPM", "component", "renew")
	}
	return next, err
}

// nextKey makes the renewal's key: in the TPM when there is one, which moves
// a file key into it. A key in the TPM, or a certificate naming the AK,
// needs the TPM.
func nextKey(cfg Config, cur *identity.Agent, namesAK bool) (crypto.Signer, error) {
	if cfg.TPM == nil {
		if namesAK || cur.KeyHolder == identity.KeyInTPM {
			return nil, errors.New("renew: this node's key is in the TPM and its certificate names the AK, but the TPM is not open: the AK must certify the next key")
		}
		return pki.GenerateKey()
	}
	key, err := cfg.TPM.NewNodeKey()
	if err != nil && !namesAK && cur.KeyHolder == identity.KeyInFile {
		// A file key stays a file key rather than expire.
		if cfg.Log != nil {
			cfg.Log.Warn("the TPM could not make the next key; it stays a file key", "component", "renew", "err", err)
		}
		return pki.GenerateKey()
	}
	if err != nil {
		return nil, fmt.Errorf("renew: make the next key in the TPM: %w", err)
	}
	return key, nil
}

// certify has the AK certify the next key over sha256(csr), after checking
// that the TPM's AK is the one the current certificate names.
func certify(t TPM, key crypto.Signer, akName, csr []byte) (*bcdv1.TPMCertification, error) {
	akPub, err := t.AKPublic()
	if err != nil {
		return nil, fmt.Errorf("renew: %w", err)
	}
	if !bytes.Equal(join.AKName(akPub), akName) {
		return nil, errors.New("renew: the TPM's AK is not the AK this node's certificate names (another TPM, or its endorsement seed changed)")
	}
	sum := sha256.Sum256(csr)
	keyPub, attest, sig, err := t.Certify(key, sum)
	if err != nil {
		return nil, fmt.Errorf("renew: certify the next key with the AK: %w", err)
	}
	return &bcdv1.TPMCertification{KeyPublic: keyPub, CertifyInfo: attest, CertifySignature: sig}, nil
}
