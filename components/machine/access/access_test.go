package access_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/sshaccess"
	"github.com/better-compute/bcd/components/machine/access"
)

const caLine = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1UrUbkA/HMG5PYPTtjNljV18Cf8t9kA4v5lsmfZuu2 ca@bcgw"

func jwksJSON(t *testing.T) string {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: "k1"}}})
	return string(b)
}

func TestCheckRefusesInjection(t *testing.T) {
	s := access.New(access.Config{Root: t.TempDir()})
	for name, body := range map[string]string{
		"newline in the CA":       `{"ssh":{"user_ca":"` + caLine + `\nPermitRootLogin yes"}}`,
		"keyword as a principal":  `{"ssh":{"user_ca":"` + caLine + `","principals":{"alice":["Match"]}}}`,
		"drop-in text":            `{"ssh":{"user_ca":"` + caLine + `"},"dropin":"PermitRootLogin yes"}`,
		"unknown field in ssh":    `{"ssh":{"user_ca":"` + caLine + `","sshd_config":"x"}}`,
		"a private key in a JWKS": `{"ticket_jwks":{"keys":[{"kty":"EC","crv":"P-256","kid":"k","x":"AA","y":"AA","d":"AA"}]}}`,
	} {
		if err := s.Check(json.RawMessage(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := s.Check(json.RawMessage(`{"ssh":{"user_ca":"` + caLine + `","principals":{"alice":["n:alice"]}},"ticket_jwks":` + jwksJSON(t) + `}`)); err != nil {
		t.Fatal(err)
	}
}

func FuzzCheck(f *testing.F) {
	f.Add([]byte(`{"ssh":{"user_ca":"` + caLine + `","principals":{"alice":["n:alice"]},"revoked_serials":[3]}}`))
	f.Add([]byte(`{"ticket_jwks":{"keys":[]}}`))
	s := access.New(access.Config{Root: "/nonexistent"})
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = s.Check(body)
	})
}

func TestPlanApplyDirect(t *testing.T) {
	testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	root := t.TempDir()
	h := sshaccess.SystemHost(root, sshaccess.DirFiles{Root: root}, nil)
	h.Account = func(n string) (int, error) {
		if n == "alice" {
			return 1000, nil
		}
		return 0, errors.New("unknown user")
	}
	h.SSHDTest = func(context.Context) error { return nil }
	h.TempDir = t.TempDir()
	s := access.New(access.Config{Root: root, Direct: true, Host: h})
	ctx := context.Background()
	body := json.RawMessage(`{"ssh":{"user_ca":"` + caLine + `","principals":{"alice":["n:alice"]}},"ticket_jwks":` + jwksJSON(t) + `}`)
	p, err := s.Plan(ctx, body)
	if err != nil || len(p.Changes) != 5 {
		t.Fatalf("plan %v, %v", p.Changes, err)
	}
	if err := s.Apply(ctx, body, p); err != nil {
		t.Fatal(err)
	}
	if s.JWKS() == nil || len(s.JWKS().Keys) != 1 {
		t.Fatal("JWKS not held")
	}
	if p, err := s.Plan(ctx, body); err != nil || len(p.Changes) != 0 {
		t.Fatalf("plan after apply %v, %v", p.Changes, err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssh/bc_principals/alice")); err != nil {
		t.Fatal(err)
	}
	// A principal for an account that is not allowed fails terminally.
	bad := json.RawMessage(`{"ssh":{"user_ca":"` + caLine + `","principals":{"root":["n:root"]}}}`)
	p, _ = s.Plan(ctx, bad)
	if err := s.Apply(ctx, bad, p); !converge.IsTerminal(err) || !errors.Is(err, sshaccess.ErrAccount) {
		t.Fatalf("root principal: %v", err)
	}
	// No section: everything removed, no JWKS.
	p, _ = s.Plan(ctx, nil)
	if err := s.Apply(ctx, nil, p); err != nil || s.JWKS() != nil {
		t.Fatalf("removing: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/ssh/bc_principals/alice")); !os.IsNotExist(err) {
		t.Fatal("principals left")
	}
}
