// Package access is the node's access section: break-glass SSH (a user CA,
// principals per local account, revoked certificates) and the JWKS that
// signs exec tickets. The SSH fields go to bcd helper's access.apply when
// bcd node runs unprivileged, and to sshaccess.Apply directly when it runs
// as root; either renders sshd's files itself from the fields. The JWKS is
// held in memory for the tunnels (components/agent/tunnel), set anew by
// every pass. docs/access.md describes the section.
package access

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/sshaccess"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/trust/ticket"
)

// Body is the section.
type Body struct {
	// SSH is the SSH part: user_ca, principals, revoked_serials,
	// revoked_key_ids (sshaccess.Spec), decoded strictly.
	SSH json.RawMessage `json:"ssh,omitempty"`
	// TicketJWKS is the JWKS whose keys sign exec tickets.
	TicketJWKS json.RawMessage `json:"ticket_jwks,omitempty"`
}

// decoded is a checked Body.
type decoded struct {
	ssh  sshaccess.Spec
	jwks *jose.JSONWebKeySet
	raw  string // the JWKS as sent, to compare with the held one
}

// Decode reads the section strictly: a CA key or principal that could
// inject an sshd line makes the whole section, and so the whole spec,
// invalid, signed or not.
func Decode(body json.RawMessage) (decoded, error) {
	var d decoded
	var b Body
	if err := converge.DecodeSection(body, &b); err != nil {
		return d, err
	}
	if len(b.SSH) > 0 && string(b.SSH) != "null" {
		s, err := sshaccess.Decode(b.SSH)
		if err != nil {
			return d, fmt.Errorf("ssh: %w", err)
		}
		d.ssh = s
	}
	if len(b.TicketJWKS) > 0 && string(b.TicketJWKS) != "null" {
		set, err := ticket.ParseJWKS(b.TicketJWKS)
		if err != nil {
			return d, fmt.Errorf("ticket_jwks: %w", err)
		}
		d.jwks, d.raw = set, string(b.TicketJWKS)
	}
	return d, nil
}

// Config is what the section needs.
type Config struct {
	// Root is the file table's root sshd's files are read under: "/" on a
	// host; data_dir/fakehw/root in fakehw builds.
	Root string
	// Helper applies the SSH part when bcd node runs unprivileged.
	Helper *helperclient.Client
	// Direct applies it in this process (bcd node runs as root, or a fakehw
	// build under its own Root). Neither: a section with SSH fails.
	Direct bool
	// SystemAccounts is [access] system_accounts (Direct only; the helper
	// reads root's own copy).
	SystemAccounts []string
	// Host replaces the sshaccess host of Root (tests).
	Host *sshaccess.Host
}

// Section is the access section.
type Section struct {
	cfg   Config
	host  *sshaccess.Host
	jwks  atomic.Pointer[heldJWKS]
	proof atomic.Pointer[rootsig.Proof]
}

// HeldProof keeps the proof of the held spec: the helper applies the
// section only with it (converge.Proven).
func (s *Section) HeldProof(p rootsig.Proof) { s.proof.Store(&p) }

type heldJWKS struct {
	set *jose.JSONWebKeySet
	raw string
}

// New returns the section.
func New(cfg Config) *Section {
	h := cfg.Host
	if h == nil {
		h = sshaccess.SystemHost(cfg.Root, sshaccess.DirFiles{Root: cfg.Root}, cfg.SystemAccounts)
	}
	return &Section{cfg: cfg, host: h}
}

// Name is "access".
func (s *Section) Name() string { return "access" }

// Check decodes body strictly.
func (s *Section) Check(body json.RawMessage) error { _, err := Decode(body); return err }

// JWKS is the exec-ticket JWKS the last pass applied (nil: none, every
// ticket is refused).
func (s *Section) JWKS() *jose.JSONWebKeySet {
	if h := s.jwks.Load(); h != nil {
		return h.set
	}
	return nil
}

// Plan lists the sshd files that differ and whether the held JWKS does.
func (s *Section) Plan(ctx context.Context, body json.RawMessage) (converge.Plan, error) {
	d, err := Decode(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	var changes []string
	held := s.jwks.Load()
	if (held == nil) != (d.jwks == nil) || held != nil && held.raw != d.raw {
		n := 0
		if d.jwks != nil {
			n = len(d.jwks.Keys)
		}
		changes = append(changes, fmt.Sprintf("hold the exec-ticket JWKS (%d keys)", n))
	}
	ssh, err := sshaccess.Plan(ctx, s.host, d.ssh)
	if err != nil {
		return converge.Plan{}, err
	}
	return converge.Plan{Changes: append(changes, ssh...), Detail: d}, nil
}

// Apply holds the JWKS, then applies the SSH part through the helper or
// directly. A refusal (an account that is not allowed, sshd -t rejecting
// the result) is Terminal for this generation.
func (s *Section) Apply(ctx context.Context, body json.RawMessage, p converge.Plan) error {
	d, ok := p.Detail.(decoded)
	if !ok {
		var err error
		if d, err = Decode(body); err != nil {
			return converge.Terminal(err)
		}
	}
	if d.jwks == nil {
		s.jwks.Store(nil)
	} else {
		s.jwks.Store(&heldJWKS{set: d.jwks, raw: d.raw})
	}
	sshChanges := 0
	for _, c := range p.Changes {
		if strings.HasPrefix(c, "write ") || strings.HasPrefix(c, "remove ") {
			sshChanges++
		}
	}
	if sshChanges == 0 {
		return nil
	}
	var err error
	switch {
	case s.cfg.Helper != nil:
		p := s.proof.Load()
		if p == nil {
			return errors.New("no proof of the held spec yet")
		}
		err = s.cfg.Helper.ApplyAccess(ctx, body, *p)
		var he *helperclient.Error
		if errors.As(err, &he) && !helperclient.IsRetryable(err) {
			return converge.Terminal(err)
		}
	case s.cfg.Direct:
		_, err = sshaccess.Apply(ctx, s.host, d.ssh)
		if errors.Is(err, sshaccess.ErrInvalid) || errors.Is(err, sshaccess.ErrAccount) || errors.Is(err, sshaccess.ErrRejected) {
			return converge.Terminal(err)
		}
	default:
		return converge.Terminal(errors.New("node-unprivileged: bcd node runs unprivileged without [helper], so it may not change sshd's configuration"))
	}
	return err
}
