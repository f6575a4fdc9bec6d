// Package releasetest makes release keys and signed release manifests
// for tests of what verifies them (the slots' Manager, the agent's
// daemon.upgrade, the helper's update.* operations).
package releasetest

import (
	"crypto"
	"testing"

	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/release"
)

// Keys are release keys and their pins, in the same order.
type Keys struct {
	Signers []crypto.Signer
	Pins    []string
}

// NewKeys makes n release keys.
func NewKeys(t testing.TB, n int) *Keys {
	t.Helper()
	k := &Keys{}
	for range n {
		s, err := pki.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		p, err := pki.Pin(s.Public())
		if err != nil {
			t.Fatal(err)
		}
		k.Signers, k.Pins = append(k.Signers, s), append(k.Pins, p)
	}
	return k
}

// Sign makes a signed document of m with the first n keys.
func (k *Keys) Sign(t testing.TB, m release.Manifest, n int) []byte {
	t.Helper()
	doc, err := release.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range k.Signers[:n] {
		if doc, err = release.Sign(doc, s); err != nil {
			t.Fatal(err)
		}
	}
	return doc
}
