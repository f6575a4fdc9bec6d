package ticket_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/better-compute/bcd/components/trust/ticket"
)

func key(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func jwks(t testing.TB, keys map[string]*ecdsa.PrivateKey) *jose.JSONWebKeySet {
	var set jose.JSONWebKeySet
	for kid, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Algorithm: "ES256", Use: "sig"})
	}
	b, _ := json.Marshal(set)
	out, err := ticket.ParseJWKS(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var now = time.Unix(1_800_000_000, 0)

func claims() ticket.Claims {
	return ticket.Claims{Node: "node-1", Kind: ticket.TCP(8080), Account: "alice", JTI: "jti-0123456789abcdef",
		Issued: now.Add(-time.Minute), Expiry: now.Add(4 * time.Minute)}
}

func TestVerify(t *testing.T) {
	k, other := key(t), key(t)
	set := jwks(t, map[string]*ecdsa.PrivateKey{"k1": k})
	good, err := ticket.Sign(k, "k1", claims())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ticket.Verify(good, set, "node-1", now)
	if err != nil || c.TCPPort() != 8080 || c.Account != "alice" || c.JTI != "jti-0123456789abcdef" {
		t.Fatalf("Verify = %+v, %v", c, err)
	}
	sign := func(k *ecdsa.PrivateKey, kid string, f func(*ticket.Claims)) string {
		c := claims()
		f(&c)
		s, err := ticket.Sign(k, kid, c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	parts := strings.Split(good, ".")
	refused := map[string]struct {
		tok  string
		node string
		at   time.Time
	}{
		"another node":           {good, "node-2", now},
		"expired":                {good, "node-1", now.Add(5 * time.Minute)},
		"a key outside the JWKS": {sign(other, "k1", func(*ticket.Claims) {}), "node-1", now},
		"an unknown kid":         {sign(other, "k2", func(*ticket.Claims) {}), "node-1", now},
		"issued in the future":   {sign(k, "k1", func(c *ticket.Claims) { c.Issued, c.Expiry = now.Add(2*time.Minute), now.Add(3*time.Minute) }), "node-1", now},
		"a tampered body":        {parts[0] + "." + parts[1] + "x." + parts[2], "node-1", now},
		"no signature":           {parts[0] + "." + parts[1] + ".", "node-1", now},
		"alg none":               {"eyJhbGciOiJub25lIiwia2lkIjoiazEifQ." + parts[1] + ".", "node-1", now},
		"not a JWT":              {"hello", "node-1", now},
		"too long":               {strings.Repeat("a", ticket.MaxToken+1), "node-1", now},
	}
	for name, tt := range refused {
		t.Run(name, func(t *testing.T) {
			if _, err := ticket.Verify(tt.tok, set, tt.node, tt.at); !errors.Is(err, ticket.ErrRefused) {
				t.Fatalf("Verify = %v, want ErrRefused", err)
			}
		})
	}
	if _, err := ticket.Verify(good, nil, "node-1", now); !errors.Is(err, ticket.ErrRefused) {
		t.Fatalf("no JWKS: %v", err)
	}
	// Sign refuses what Verify would.
	for name, f := range map[string]func(*ticket.Claims){
		"long lifetime": func(c *ticket.Claims) { c.Expiry = c.Issued.Add(time.Hour) },
		"short jti":     func(c *ticket.Claims) { c.JTI = "x" },
		"bad kind":      func(c *ticket.Claims) { c.Kind = "tcp:0" },
		"bad account":   func(c *ticket.Claims) { c.Account = "a b" },
	} {
		c := claims()
		f(&c)
		if _, err := ticket.Sign(k, "k1", c); err == nil {
			t.Errorf("Sign with %s succeeded", name)
		}
	}
}

func TestParseJWKS(t *testing.T) {
	k := key(t)
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: k, KeyID: "k1"}}})
	nokid, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey}}})
	for name, b := range map[string]string{
		"private key": string(priv), "no kid": string(nokid), "no keys": `{"keys":[]}`, "not JSON": `x`,
	} {
		if _, err := ticket.ParseJWKS([]byte(b)); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

func TestCheckKind(t *testing.T) {
	for _, k := range []string{"console", "ssh", "tcp:1", "tcp:65535"} {
		if err := ticket.CheckKind(k); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
	for _, k := range []string{"", "shell", "tcp:", "tcp:0", "tcp:65536", "tcp:080", "tcp:-1", "TCP:22"} {
		if err := ticket.CheckKind(k); err == nil {
			t.Errorf("%s accepted", k)
		}
	}
}

func FuzzVerify(f *testing.F) {
	k := key(f)
	set := jwks(f, map[string]*ecdsa.PrivateKey{"k1": k})
	good, _ := ticket.Sign(k, "k1", claims())
	f.Add(good)
	ic := claims()
	ic.Instance = "vm-a"
	inst, _ := ticket.Sign(k, "k1", ic)
	f.Add(inst)
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := ticket.Verify(tok, set, "node-1", now)
		if err == nil && (c.Node != "node-1" || !now.Before(c.Expiry) || ticket.CheckKind(c.Kind) != nil || c.Instance != "" && !ticket.InstanceID(c.Instance)) {
			t.Fatalf("accepted %+v", c)
		}
	})
}

// TestTCPKindReachesOnlyLoopback: a tcp tunnel reaches a port on the
// node's loopback and nothing else, so a kind that names a host as well
// (tcp:HOST:PORT) is refused by CheckKind, by Sign, and by Verify when a
// holder of a JWKS key signed it anyway.
func TestTCPKindReachesOnlyLoopback(t *testing.T) {
	k := key(t)
	set := jwks(t, map[string]*ecdsa.PrivateKey{"k1": k})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: k, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"tcp:10.0.0.1:22", "tcp:192.0.2.1:8080", "tcp:gw.example:443", "tcp:[2001:db8::1]:22",
		"tcp:127.0.0.1:22", "tcp:localhost:22", "tcp::22", "tcp:22:22"} {
		if err := ticket.CheckKind(kind); err == nil {
			t.Errorf("a tcp tunnel reaches only loopback: CheckKind accepted %q", kind)
		}
		c := claims()
		c.Kind = kind
		if _, err := ticket.Sign(k, "k1", c); err == nil {
			t.Errorf("a tcp tunnel reaches only loopback: Sign made a ticket for %q", kind)
		}
		tok, err := jwt.Signed(signer).Claims(map[string]any{"aud": c.Node, "sub": c.Account, "kind": kind, "jti": c.JTI,
			"iat": c.Issued.Unix(), "exp": c.Expiry.Unix()}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ticket.Verify(tok, set, "node-1", now); err == nil {
			t.Errorf("a tcp tunnel reaches only loopback: Verify accepted a ticket for %q (port %d)", kind, got.TCPPort())
		} else if !errors.Is(err, ticket.ErrRefused) || !strings.Contains(err.Error(), "tcp:<port>") {
			t.Errorf("%s: %v, want a refusal of the kind", kind, err)
		}
	}
}

// TestInstanceClaim: an instance ticket names its instance and Verify
// gives it back; a node ticket has no instance claim at all (so a node
// that decodes claims strictly and knows no instance refuses an instance
// ticket); an instance that is not an id is refused by Sign and Verify.
func TestInstanceClaim(t *testing.T) {
	k := key(t)
	set := jwks(t, map[string]*ecdsa.PrivateKey{"k1": k})
	c := claims()
	c.Instance = "vm-a"
	tok, err := ticket.Sign(k, "k1", c)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ticket.Verify(tok, set, "node-1", now); err != nil || got.Instance != "vm-a" {
		t.Fatalf("Verify = %+v, %v", got, err)
	}
	node, err := ticket.Sign(k, "k1", claims())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := base64.RawURLEncoding.DecodeString(strings.Split(node, ".")[1])
	if strings.Contains(string(body), "instance") {
		t.Errorf("a node ticket carries an instance claim: %s", body)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: k, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"../vm", "-vm", "vm a", strings.Repeat("v", 65)} {
		c := claims()
		c.Instance = id
		if _, err := ticket.Sign(k, "k1", c); err == nil {
			t.Errorf("Sign made a ticket for instance %q", id)
		}
		raw, err := jwt.Signed(signer).Claims(map[string]any{"aud": c.Node, "sub": c.Account, "kind": c.Kind, "instance": id,
			"jti": c.JTI, "iat": c.Issued.Unix(), "exp": c.Expiry.Unix()}).Serialize()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ticket.Verify(raw, set, "node-1", now); !errors.Is(err, ticket.ErrRefused) {
			t.Errorf("Verify of instance %q: %v, want ErrRefused", id, err)
		}
	}
}
