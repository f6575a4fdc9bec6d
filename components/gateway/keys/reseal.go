package keys

import (
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Reseal rotates the key-encryption key of a database's key set: every
// key is opened with old and sealed under next, and the set is replaced
// in one transaction only while it is still sealed under old. The keys
// themselves do not change (the pins agents hold stay valid), so no node
// joins again. Gateways running meanwhile keep the keys they unsealed at
// their start; each needs next from its next start on. It returns how
// many keys it resealed.
func Reseal(ks store.KeyStore, old, next *kek.KEK) (int, error) {
	if old.Fingerprint() == next.Fingerprint() {
		return 0, errors.New("the new key-encryption key is the one the keys are sealed under")
	}
	fp, sealed, err := ks.Keys()
	if err != nil {
		return 0, fmt.Errorf("read the key set: %w", err)
	}
	if fp != old.Fingerprint() {
		if fp == next.Fingerprint() {
			return 0, fmt.Errorf("the database's keys are sealed under %s already", fp)
		}
		return 0, fmt.Errorf("the database's keys are sealed under key-encryption key %s, not the %s given", fp, old.Fingerprint())
	}
	out := make([]store.SealedKey, 0, len(sealed))
	for _, sk := range sealed {
		b, err := old.Open(sk.Name, sk.Version, sk.Sealed)
		if err != nil {
			return 0, fmt.Errorf("the database's key %s: %w", sk.Name, err)
		}
		s, err := next.Seal(sk.Name, sk.Version, b)
		clear(b)
		if err != nil {
			return 0, err
		}
		out = append(out, store.SealedKey{Name: sk.Name, Version: sk.Version, Sealed: s})
	}
	done, err := ks.ResealKeys(old.Fingerprint(), next.Fingerprint(), out)
	if err != nil {
		return 0, fmt.Errorf("store the resealed keys: %w", err)
	}
	if !done {
		return 0, errors.New("the key set changed while it was resealed (another rotation?): nothing was changed; read bcgw kek fingerprint and try again")
	}
	return len(out), nil
}
