// Package ticket is exec tickets: short-lived JWTs (ES256) that open one
// tunnel to one node. A ticket names the node (aud), the kind (console,
// ssh or tcp:<port>), the local account (sub), its expiry and a jti, and is
// signed by a key of the JWKS the node's access section holds. An instance
// ticket also names an instance of that node: its tunnel reaches the
// instance (its serial console, its port 22 or another port of its own
// address), never the node. Verify checks all of that; the agent also
// keeps the spent jtis (one tunnel per ticket). docs/access.md describes
// them.
package ticket

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Limits.
const (
	MaxToken    = 4 << 10          // bytes of a ticket
	MaxLifetime = 15 * time.Minute // exp - iat
	MaxKeys     = 8                // keys in a JWKS
	MaxJWKS     = 16 << 10         // bytes of a JWKS
	// Skew is how far a ticket's iat may lie ahead of the node's clock.
	Skew = time.Minute
)

// Kinds of tunnel.
const (
	KindConsole = "console"
	KindSSH     = "ssh"
	kindTCP     = "tcp:"
)

// ErrRefused is wrapped by every refusal of a ticket.
var ErrRefused = errors.New("exec ticket refused")

// Claims are what a ticket says.
type Claims struct {
	Node    string // aud: the node id
	Kind    string // console, ssh or tcp:<port>
	Account string // sub: the local account (a console's shell runs as it); an instance ticket's: who asked
	// Instance is an instance ticket's instance of Node ("" for a ticket
	// to the node itself).
	Instance string
	JTI      string    // the ticket's id, spent when a tunnel opens
	Issued   time.Time // iat
	Expiry   time.Time // exp
}

// TCPPort is the port of a tcp:<port> kind (0 for another kind).
func (c Claims) TCPPort() int {
	p, ok := strings.CutPrefix(c.Kind, kindTCP)
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// TCP is the kind of a tunnel to a loopback TCP port.
func TCP(port int) string { return kindTCP + strconv.Itoa(port) }

// CheckKind accepts console, ssh and tcp:<1-65535> (no leading zero).
func CheckKind(k string) error {
	switch k {
	case KindConsole, KindSSH:
		return nil
	}
	if p, ok := strings.CutPrefix(k, kindTCP); ok {
		n, err := strconv.Atoi(p)
		if err == nil && n >= 1 && n <= 65535 && strconv.Itoa(n) == p {
			return nil
		}
	}
	return fmt.Errorf("kind %q is not console, ssh or tcp:<port>", clip(k))
}

// checkName is an id or account: [A-Za-z0-9._@-], 1 to 64, not starting
// with '-' or '.'.
func checkName(what, s string) error {
	if len(s) == 0 || len(s) > 64 {
		return fmt.Errorf("%s must be 1 to 64 characters", what)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '@' ||
			(c == '.' || c == '-') && i > 0) {
			return fmt.Errorf("%s %q has a character outside [A-Za-z0-9._@-]", what, clip(s))
		}
	}
	return nil
}

// check is what Sign and Verify require of claims besides the signature
// and the clock.
func (c Claims) check() error {
	if err := checkName("node", c.Node); err != nil {
		return err
	}
	if err := CheckKind(c.Kind); err != nil {
		return err
	}
	if err := checkName("account", c.Account); err != nil {
		return err
	}
	if c.Instance != "" && !InstanceID(c.Instance) {
		return fmt.Errorf("instance %q is not an instance id ([A-Za-z0-9][A-Za-z0-9_-], 1 to 64)", clip(c.Instance))
	}
	if len(c.JTI) < 16 || len(c.JTI) > 64 || checkName("jti", c.JTI) != nil {
		return errors.New("jti must be 16 to 64 characters of [A-Za-z0-9._@-]")
	}
	if !c.Expiry.After(c.Issued) || c.Expiry.Sub(c.Issued) > MaxLifetime {
		return fmt.Errorf("lifetime must be above 0 and at most %s", MaxLifetime)
	}
	return nil
}

// claimsJSON is the JWT body.
type claimsJSON struct {
	Aud  string `json:"aud"`
	Sub  string `json:"sub"`
	Kind string `json:"kind"`
	// Instance is left out of a node ticket, so a node that knows no
	// instance tickets (strict claims) refuses an instance ticket rather
	// than open a tunnel to itself.
	Instance string `json:"instance,omitempty"`
	JTI      string `json:"jti"`
	Iat      int64  `json:"iat"`
	Exp      int64  `json:"exp"`
}

// Sign makes a ticket signed by key under kid.
func Sign(key *ecdsa.PrivateKey, kid string, c Claims) (string, error) {
	if err := c.check(); err != nil {
		return "", err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return "", err
	}
	return jwt.Signed(signer).Claims(claimsJSON{Aud: c.Node, Sub: c.Account, Kind: c.Kind, Instance: c.Instance, JTI: c.JTI,
		Iat: c.Issued.Unix(), Exp: c.Expiry.Unix()}).Serialize()
}

// Verify checks token against jwks for node at now: an ES256 JWS whose
// kid names a key of jwks and whose signature that key made, with exactly
// the claims of a ticket, aud equal to node, not expired, issued no later
// than now + Skew and living at most MaxLifetime. The spent jtis are the
// caller's.
func Verify(token string, jwks *jose.JSONWebKeySet, node string, now time.Time) (Claims, error) {
	refuse := func(format string, a ...any) (Claims, error) {
		return Claims{}, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	if len(token) > MaxToken {
		return refuse("more than %d bytes", MaxToken)
	}
	if jwks == nil || len(jwks.Keys) == 0 {
		return refuse("this node holds no exec-ticket JWKS (the access section has none)")
	}
	tok, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		return refuse("not a signed JWT: %v", err)
	}
	if len(tok.Headers) != 1 {
		return refuse("%d signatures, want 1", len(tok.Headers))
	}
	kid := tok.Headers[0].KeyID
	keys := jwks.Key(kid)
	if kid == "" || len(keys) != 1 {
		return refuse("signed by key %q, which the access section's JWKS does not hold", clip(kid))
	}
	var raw json.RawMessage
	if err := tok.Claims(keys[0].Key, &raw); err != nil {
		return refuse("signature: %v", err)
	}
	var cj claimsJSON
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cj); err != nil {
		return refuse("claims: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return refuse("claims: data after the object")
	}
	c := Claims{Node: cj.Aud, Account: cj.Sub, Kind: cj.Kind, Instance: cj.Instance, JTI: cj.JTI, Issued: time.Unix(cj.Iat, 0), Expiry: time.Unix(cj.Exp, 0)}
	if err := c.check(); err != nil {
		return refuse("%v", err)
	}
	switch {
	case c.Node != node:
		return refuse("for node %s, not this node (%s)", c.Node, node)
	case !now.Before(c.Expiry):
		return refuse("expired at %s", c.Expiry.UTC().Format(time.RFC3339))
	case c.Issued.After(now.Add(Skew)):
		return refuse("issued at %s, in the future", c.Issued.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// ParseJWKS reads an exec-ticket JWKS strictly: 1 to MaxKeys public P-256
// keys, each with a kid of its own, alg ES256 or none, use sig or none.
func ParseJWKS(b []byte) (*jose.JSONWebKeySet, error) {
	if len(b) > MaxJWKS {
		return nil, fmt.Errorf("JWKS of %d bytes; at most %d", len(b), MaxJWKS)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	if len(set.Keys) == 0 || len(set.Keys) > MaxKeys {
		return nil, fmt.Errorf("JWKS: %d keys; 1 to %d", len(set.Keys), MaxKeys)
	}
	seen := map[string]bool{}
	for i, k := range set.Keys {
		pub, ok := k.Key.(*ecdsa.PublicKey)
		switch {
		case !ok || pub.Curve != elliptic.P256():
			return nil, fmt.Errorf("JWKS: key %d is not a public P-256 key", i)
		case k.KeyID == "" || seen[k.KeyID]:
			return nil, fmt.Errorf("JWKS: key %d has no kid or one another key has", i)
		case k.Algorithm != "" && k.Algorithm != string(jose.ES256):
			return nil, fmt.Errorf("JWKS: key %d is for %s, not ES256", i, k.Algorithm)
		case k.Use != "" && k.Use != "sig":
			return nil, fmt.Errorf("JWKS: key %d is for use %q, not sig", i, k.Use)
		}
		seen[k.KeyID] = true
	}
	return &set, nil
}

// InstanceID reports whether s has the shape of an instance id:
// [A-Za-z0-9][A-Za-z0-9_-], 1 to 64 characters (docs/instances.md).
func InstanceID(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] == '-' || s[0] == '_' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
