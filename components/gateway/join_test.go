package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/wellknown"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
	"github.com/go-jose/go-jose/v4"
)

// joinRequest builds a JoinRequest by hand: the token sealed to jwk, bound
// to bindCSR, with a CSR for a new key.
func joinRequest(t *testing.T, jwk *jose.JSONWebKey, tok, role string, bindCSR []byte, issued time.Time) (*bcdv1.JoinRequest, []byte) {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key, "raw-join")
	if err != nil {
		t.Fatal(err)
	}
	if bindCSR == nil {
		bindCSR = csr
	}
	sum := sha256.Sum256(bindCSR)
	sealed, err := pki.SealToken(jwk, pki.SealedToken{Token: tok, CSRSHA256: fmt.Sprintf("%x", sum), IssuedAt: issued.Unix()})
	if err != nil {
		t.Fatal(err)
	}
	return &bcdv1.JoinRequest{Role: role, SealedToken: sealed, Csr: csr}, csr
}

func otherCSR(t *testing.T) []byte {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(k, "other")
	if err != nil {
		t.Fatal(err)
	}
	return csr
}

func secretOf(tok string) string { return tok[strings.LastIndex(tok, "_")+1:] }

func TestJoinStoresNode(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	dir := t.TempDir()
	a, err := join.Join(context.Background(), joinOpts(g, g.client(t, nil), g.token(t, "node", 1), dir))
	if err != nil {
		t.Fatal(err)
	}
	n, err := g.s.Store().Node(a.NodeID)
	if err != nil {
		t.Fatalf("joined node %s is not stored: %v", a.NodeID, err)
	}
	if n.Role != "node" || n.Site != "lab" || n.Hostname != "host-under-test" {
		t.Errorf("stored node %+v, want role node, site lab, hostname host-under-test", n)
	}
	if n.CertSerial != a.Cert.SerialNumber.Text(16) || n.SPIFFEID != a.SPIFFEID {
		t.Errorf("stored serial/spiffe %s %s, agent has %s %s", n.CertSerial, n.SPIFFEID, a.Cert.SerialNumber.Text(16), a.SPIFFEID)
	}
	if want := "spiffe://bcgw.lab/node/" + a.NodeID; a.SPIFFEID != want {
		t.Errorf("SPIFFE id %s, want %s", a.SPIFFEID, want)
	}
	loaded, err := identity.Load(dir)
	if err != nil || loaded.NodeID != a.NodeID {
		t.Fatalf("identity in data dir: %v %+v", err, loaded)
	}
}

func TestJoinTokenUsesAreCounted(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	cl := g.client(t, nil)
	tok := g.token(t, "node", 1)
	if _, err := join.Join(context.Background(), joinOpts(g, cl, tok, t.TempDir())); err != nil {
		t.Fatalf("first join: %v", err)
	}
	// The raw RPC says why.
	req, _ := joinRequest(t, g.jwk, tok, "node", nil, time.Now())
	_, err := cl.Join(context.Background(), connect.NewRequest(req))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("second use of a one-use token: %v, want PermissionDenied", err)
	}
	// The join client reports a refusal and stores nothing.
	dir := t.TempDir()
	_, err = join.Join(context.Background(), joinOpts(g, cl, tok, dir))
	if err == nil || !strings.HasPrefix(err.Error(), "Join refused: ") {
		t.Fatalf("join.Join with a spent token: %v, want Join refused", err)
	}
	if _, err := identity.Load(dir); !errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("refused join left an identity: %v", err)
	}
	nodes, err := g.s.Store().Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("%d nodes stored, want 1 (the refused joins must add none)", len(nodes))
	}
}

// TestJoinRefusals: every refusal has the right code, adds no node, and
// neither its message nor the gateway's log holds the token or its secret.
func TestJoinRefusals(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	cl := g.client(t, nil)

	// A second gateway, with keys of its own.
	other, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", URL: "https://other.invalid:443"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Store().Close() })
	odoc, err := other.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	ob, _ := json.Marshal(odoc)
	_, otherJWK, err := wellknown.Parse(ob)
	if err != nil {
		t.Fatal(err)
	}
	if odoc.Pins.JoinEncryption == g.pins.JoinEncryption {
		t.Fatal("two gateways share a join encryption key")
	}

	var tokens []string
	tok := func(role string, uses int, ttl time.Duration) string {
		tk, _, err := g.s.NewToken(role, "lab", uses, ttl)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tk)
		return tk
	}
	siteTok := tok("site", 1, 0)
	nodeTok := tok("node", 5, 0)
	expired := tok("node", 1, time.Nanosecond)
	wrongSecret := nodeTok[:strings.LastIndex(nodeTok, "_")+1] + strings.Repeat("a", len(secretOf(nodeTok)))
	tokens = append(tokens, wrongSecret)

	tests := []struct {
		name string
		req  func() *bcdv1.JoinRequest
		code connect.Code
	}{
		{"role not allowed by token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, siteTok, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed token bound to another CSR", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", otherCSR(t), time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed for another gateway's key", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, otherJWK, nodeTok, "node", nil, time.Now())
			return r
		}, connect.CodeInvalidArgument},
		{"wrong secret", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, wrongSecret, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"expired token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, expired, "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"sealed an hour ago", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now().Add(-time.Hour))
			return r
		}, connect.CodePermissionDenied},
		{"not a bcjt token", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, "notatoken", "node", nil, time.Now())
			return r
		}, connect.CodePermissionDenied},
		{"role neither node nor site", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "admin", nil, time.Now())
			return r
		}, connect.CodeInvalidArgument},
		{"unsupported attestor", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now())
			r.Attestor = "aws-sts"
			return r
		}, connect.CodeUnimplemented},
		{"cloud-iid on a gateway that pins no certificates", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now())
			r.Attestor = "cloud-iid"
			return r
		}, connect.CodePermissionDenied},
		{"garbage CSR", func() *bcdv1.JoinRequest {
			r, _ := joinRequest(t, g.jwk, nodeTok, "node", nil, time.Now())
			r.Csr = []byte("not a csr")
			return r
		}, connect.CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := cl.Join(context.Background(), connect.NewRequest(tt.req()))
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want code %v", err, tt.code)
			}
			for _, tk := range tokens {
				if strings.Contains(err.Error(), tk) || strings.Contains(err.Error(), secretOf(tk)) {
					t.Errorf("error %q holds a token or its secret", err)
				}
			}
		})
	}
	nodes, err := g.s.Store().Nodes()
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 0 {
		t.Fatalf("refused joins stored %d nodes", len(nodes))
	}
	// The site token was not used up by the refused node join.
	r, _ := joinRequest(t, g.jwk, siteTok, "site", nil, time.Now())
	if _, err := cl.Join(context.Background(), connect.NewRequest(r)); err != nil {
		t.Fatalf("site join with the site token after a refused node join: %v", err)
	}
	logs := g.logs.String()
	if !strings.Contains(logs, "join refused") {
		t.Fatalf("the gateway logged no refusal; log:\n%s", logs)
	}
	for _, tk := range tokens {
		if strings.Contains(logs, tk) || strings.Contains(logs, secretOf(tk)) {
			t.Errorf("the gateway log holds a token or its secret:\n%s", logs)
		}
	}
}

func TestRenew(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	cl := g.client(t, certOf(a))
	newKey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(newKey, "renewed")
	if err != nil {
		t.Fatal(err)
	}
	stranger, _ := pki.GenerateKey()
	mustSign := func(purpose string, signer *identity.Agent, useStranger bool) []byte {
		t.Helper()
		var sig []byte
		var err error
		if useStranger {
			sig, err = pki.Sign(stranger, purpose, csr)
		} else {
			sig, err = pki.Sign(signer.Key, purpose, csr)
		}
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	// Refusals first: the good case supersedes the certificate.
	refusals := []struct {
		name   string
		client bcdv1connect.AgentGatewayClient
		proof  []byte
		csr    []byte
		code   connect.Code
	}{
		{"proof made for the join-response purpose", cl, mustSign(pki.PurposeJoinResponse, a, false), csr, connect.CodePermissionDenied},
		{"proof by another key", cl, mustSign(pki.PurposeRenew, a, true), csr, connect.CodePermissionDenied},
		{"proof over another CSR", cl, mustSign(pki.PurposeRenew, a, false), otherCSR(t), connect.CodePermissionDenied},
		{"no client certificate", g.client(t, nil), mustSign(pki.PurposeRenew, a, false), csr, connect.CodeUnauthenticated},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.client.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: tt.csr, Proof: tt.proof}))
			if connect.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want %v", err, tt.code)
			}
		})
	}
	n, _ := g.s.Store().Node(a.NodeID)
	if n.CertSerial != a.Cert.SerialNumber.Text(16) {
		t.Fatal("a refused renewal changed the node's certificate serial")
	}

	resp, err := cl.Renew(context.Background(), connect.NewRequest(&bcdv1.RenewRequest{Csr: csr, Proof: mustSign(pki.PurposeRenew, a, false)}))
	if err != nil {
		t.Fatalf("Renew with a valid proof: %v", err)
	}
	res, cert, err := join.VerifyResponse(resp.Msg, g.pins.JoinSigning, csr, newKey.Public(), "node")
	if err != nil {
		t.Fatalf("renewal response does not verify: %v", err)
	}
	if res.GetNodeId() != a.NodeID || !newKey.PublicKey.Equal(cert.PublicKey) {
		t.Fatalf("renewed certificate: node %s, want %s and the new key", res.GetNodeId(), a.NodeID)
	}
	n, _ = g.s.Store().Node(a.NodeID)
	if n.CertSerial != cert.SerialNumber.Text(16) {
		t.Errorf("stored serial %s, want the renewed %s", n.CertSerial, cert.SerialNumber.Text(16))
	}
	// The new certificate opens a session; the old one is superseded.
	renewed, err := identity.Save(t.TempDir(), newKey, cert, a.Identity)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, f, err := openSession(t, ctx, g.client(t, certOf(renewed)), a.NodeID); err != nil || f.GetWelcome() == nil {
		t.Fatalf("session with the renewed certificate: %v %v", err, f)
	}
	if _, _, err := openSession(t, context.Background(), g.client(t, certOf(a)), a.NodeID); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("session with the superseded certificate: %v, want Unauthenticated", err)
	}
}

func TestWellKnownServed(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	doc, jwk, err := wellknown.Fetch(context.Background(), g.url, g.pins.ServingCA)
	if err != nil {
		t.Fatalf("fetch over pinned TLS: %v", err)
	}
	want, _ := g.s.WellKnown()
	if doc.Pins != want.Pins || doc.Gateway != want.Gateway || doc.Gateway.URL != g.url {
		t.Errorf("fetched %+v, want %+v", doc, want)
	}
	if pin, _ := pki.JWKPin(jwk); pin != g.pins.JoinEncryption {
		t.Error("fetched encryption key does not match its pin")
	}
	// Another serving CA pin is refused.
	otherCA, _ := pki.NewCA("other", time.Hour)
	if _, _, err := wellknown.Fetch(context.Background(), g.url, pki.PinOfCert(otherCA.Cert)); err == nil {
		t.Error("fetch with another serving CA pin succeeded")
	}
}

func TestWellKnownBeforeRun(t *testing.T) {
	s, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Store().Close()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("WellKnown before Run panicked: %v", r)
		}
	}()
	_, _ = s.WellKnown()
}
