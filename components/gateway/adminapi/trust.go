package adminapi

import (
	"crypto"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/components/base/privfile"
	"github.com/better-compute/bcd/components/trust/pki"
)

// ReadSigningKey reads a command-signing key (P-256, PKCS#8 PEM "PRIVATE
// KEY") from a file that only its owner may read. Errors name the file,
// never its contents.
func ReadSigningKey(path string) (crypto.Signer, error) {
	b, err := privfile.Read(path, 64<<10, "a PEM private key is far smaller")
	if err != nil {
		return nil, err
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	clear(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// ParsePublicKeyPEM reads a command-signing root: one PEM "PUBLIC KEY"
// block holding an ECDSA P-256 key. It returns the key's SPKI DER as Go
// encodes it (the form the bundle carries and the key id is taken of).
func ParsePublicKeyPEM(b []byte) ([]byte, error) {
	return parsePublicKeyPEM(b, "a command-signing root")
}

// parsePublicKeyPEM reads one PEM "PUBLIC KEY" block holding an ECDSA
// P-256 key, what (for errors) says what the key is to be.
func parsePublicKeyPEM(b []byte, what string) ([]byte, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block found; want a PEM \"PUBLIC KEY\" (openssl ec -pubout)")
	}
	if blk.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("PEM block is %q; want \"PUBLIC KEY\" (a private key is never given to bcgw trust)", TruncateString(blk.Type, 40))
	}
	return CanonicalKey(blk.Bytes, what)
}

// TrustRoot is one command-signing root as the admin API shows it.
type TrustRoot struct {
	Pin string `json:"pin"`
	// Own: this is bcgw's own command-signing key.
	Own bool `json:"own,omitempty"`
}

// TrustNode is the trust bundle version a node last said it holds.
type TrustNode struct {
	Node         string     `json:"node"`
	Connected    bool       `json:"connected"`
	TrustVersion uint64     `json:"trust_version"`
	At           *time.Time `json:"at,omitempty"`
}

// TrustView is the trust bundle as the admin API and `bcgw trust show`
// show it.
type TrustView struct {
	Version uint64      `json:"version"`
	Roots   []TrustRoot `json:"roots"`
	// OwnKey is the pin of bcgw's own command-signing key ("" when it
	// runs with --command-key none); OwnKeyIsRoot whether the bundle
	// names it.
	OwnKey       string `json:"own_key,omitempty"`
	OwnKeyIsRoot bool   `json:"own_key_is_root"`
	// Approvers is the bundle's approver set (absent: none, and agents
	// run destructive commands without a batch).
	Approvers *ApproversView `json:"approvers,omitempty"`
	Nodes     []TrustNode    `json:"nodes"`
}

// TrustChange answers a change of the trust bundle.
type TrustChange struct {
	Version uint64 `json:"version"`
	// Changed is false when the bundle already was as asked (the version
	// stays).
	Changed bool   `json:"changed"`
	Pin     string `json:"pin"`
	Roots   int    `json:"roots"`
}

// TrustRootRequest names a command-signing root by its SPKI DER.
type TrustRootRequest struct {
	SPKI []byte `json:"spki"`
}
