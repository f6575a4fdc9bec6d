// Package wsproof is what each end proves on the WebSocket fallback
// (docs/protocol.md#the-websocket-fallback). Through a proxy that
// terminates TLS no client certificate reaches the gateway, and the agent
// cannot pin the gateway's serving CA, so each end signs the other's fresh
// nonce instead: the gateway's join-signing key (which the agent pins at
// join) signs the agent's nonce with a challenge of its own, and the node
// key signs that challenge. A proxy can relay both, but cannot make either
// up, nor use one twice.
package wsproof

import (
	"bytes"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
)

// Purposes of the fallback's signatures (pki.Sign).
const (
	// PurposeGateway: the join-signing key over the agent's nonce and the
	// gateway's challenge.
	PurposeGateway = "bcd/ws-gateway/v1"
	// PurposeSession: the node key over the challenge and the agent's
	// nonce, opening a session.
	PurposeSession = "bcd/ws-session/v1"
	// PurposeRenew: the node key over the challenge, the agent's nonce and
	// the SHA-256 of the renewal request it sends.
	PurposeRenew = "bcd/ws-renew/v1"
)

const (
	// NonceSize is the agent's nonce.
	NonceSize = 32
	// ChallengeSize is the gateway's challenge: issued (unix ms, 8 bytes),
	// 16 random bytes, and a MAC of both (32 bytes).
	ChallengeSize = 8 + 16 + 32
	// Lifetime is how long a challenge may be answered.
	Lifetime = time.Minute
	// MaxMessage bounds a Challenge or a Proof as JSON.
	MaxMessage = 16 << 10
)

// Challenge is the gateway's first word on the fallback.
type Challenge struct {
	Challenge  []byte `json:"challenge"`
	SigningKey []byte `json:"signing_key"` // SPKI DER of the join-signing key
	Signature  []byte `json:"signature"`   // PurposeGateway over nonce || challenge
}

// Proof is the node's answer: its certificate and its key's signature.
type Proof struct {
	Certificate []byte `json:"certificate"` // DER
	Signature   []byte `json:"signature"`
}

// Decode parses a Challenge or a Proof strictly.
func Decode(b []byte, v any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("larger than %d bytes", MaxMessage)
	}
	return decode(b, v)
}

func decode(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Issuer makes and spends the gateway's challenges. The MAC key may be
// shared by every gateway of a fleet (derived from a key they share), so
// a challenge issued by one is answered at another; each gateway refuses
// a challenge it has seen spent.
type Issuer struct {
	key    crypto.Signer
	spki   []byte
	macKey []byte
	now    func() time.Time
	mu     sync.Mutex
	spent  map[string]time.Time
}

// NewIssuer signs with the join-signing key (whose SPKI DER is spki) and
// MACs challenges with macKey.
func NewIssuer(key crypto.Signer, spki, macKey []byte, now func() time.Time) *Issuer {
	if now == nil {
		now = time.Now
	}
	return &Issuer{key: key, spki: spki, macKey: macKey, now: now, spent: map[string]time.Time{}}
}

func (i *Issuer) mac(b []byte) []byte {
	m := hmac.New(sha256.New, i.macKey)
	m.Write([]byte("bcd-ws-challenge-v1"))
	m.Write(b)
	return m.Sum(nil)
}

// Issue makes a challenge for the agent's nonce, signed.
func (i *Issuer) Issue(nonce []byte) (Challenge, error) {
	if len(nonce) != NonceSize {
		return Challenge{}, fmt.Errorf("the agent's nonce must be %d bytes", NonceSize)
	}
	c := make([]byte, 24, ChallengeSize)
	binary.BigEndian.PutUint64(c, uint64(i.now().UnixMilli()))
	if _, err := rand.Read(c[8:24]); err != nil {
		return Challenge{}, err
	}
	c = append(c, i.mac(c)...)
	sig, err := pki.Sign(i.key, PurposeGateway, gatewayMsg(nonce, c))
	if err != nil {
		return Challenge{}, err
	}
	return Challenge{Challenge: c, SigningKey: i.spki, Signature: sig}, nil
}

// Spend checks that challenge is one of ours, not older than Lifetime,
// and not spent before, and spends it.
func (i *Issuer) Spend(challenge []byte) error {
	if len(challenge) != ChallengeSize || !hmac.Equal(i.mac(challenge[:24]), challenge[24:]) {
		return errors.New("the challenge is not one this gateway issued")
	}
	now := i.now()
	issued := time.UnixMilli(int64(binary.BigEndian.Uint64(challenge)))
	if now.Sub(issued) > Lifetime || issued.Sub(now) > 5*time.Second {
		return errors.New("the challenge expired; ask for another")
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	for k, at := range i.spent {
		if now.Sub(at) > 2*Lifetime {
			delete(i.spent, k)
		}
	}
	k := string(challenge[8:24])
	if _, ok := i.spent[k]; ok {
		return errors.New("the challenge was answered before")
	}
	i.spent[k] = now
	return nil
}

func gatewayMsg(nonce, challenge []byte) []byte {
	return append(append([]byte{}, nonce...), challenge...)
}

func nodeMsg(c Challenge, nonce, body []byte) []byte {
	sum := sha256.Sum256(body)
	return append(append(append([]byte{}, c.Challenge...), nonce...), sum[:]...)
}

// VerifyGateway checks the gateway's proof: its signing key is the one
// signingPin names and it signed this agent's nonce with the challenge.
func VerifyGateway(c Challenge, nonce []byte, signingPin string) error {
	if len(c.Challenge) != ChallengeSize {
		return errors.New("gateway proof: the challenge is malformed")
	}
	pub, err := x509.ParsePKIXPublicKey(c.SigningKey)
	if err != nil {
		return fmt.Errorf("gateway proof: signing key: %w", err)
	}
	if err := pki.MatchPin(signingPin, pub); err != nil {
		return fmt.Errorf("gateway proof: the signing key is not the pinned join-signing key: %w", err)
	}
	if err := pki.Verify(pub, PurposeGateway, gatewayMsg(nonce, c.Challenge), c.Signature); err != nil {
		return fmt.Errorf("gateway proof: the signature does not verify: %w", err)
	}
	return nil
}

// SignNode is the node's proof for purpose over the challenge, its nonce
// and body (empty for a session; the renewal request for a renewal).
func SignNode(key crypto.Signer, cert []byte, purpose string, c Challenge, nonce, body []byte) (Proof, error) {
	sig, err := pki.Sign(key, purpose, nodeMsg(c, nonce, body))
	if err != nil {
		return Proof{}, err
	}
	return Proof{Certificate: cert, Signature: sig}, nil
}

// VerifyNode checks the node's proof under the certificate's key (the
// caller verifies the certificate itself).
func VerifyNode(cert *x509.Certificate, p Proof, purpose string, c Challenge, nonce, body []byte) error {
	if len(nonce) != NonceSize {
		return fmt.Errorf("the agent's nonce must be %d bytes", NonceSize)
	}
	if err := pki.Verify(cert.PublicKey, purpose, nodeMsg(c, nonce, body), p.Signature); err != nil {
		return fmt.Errorf("node proof does not verify under the certificate's key: %w", err)
	}
	return nil
}

// NewNonce is a fresh agent nonce.
func NewNonce() []byte {
	b := make([]byte, NonceSize)
	_, _ = rand.Read(b)
	return b
}
