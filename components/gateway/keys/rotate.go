package keys

import (
	"crypto"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/pki"
)

// ErrKEKMoved is the error of Stored when the database's keys are sealed
// under another key-encryption key than the gateway's (it was rotated,
// bcgw kek rotate, and this gateway not yet restarted with the new one).
var ErrKEKMoved = errors.New("the database's keys are sealed under another key-encryption key")

// Stored reads one key of a database's key set and opens it with k: its
// version (1 when the set was made, one more at each rotation) and its
// signer, a P-256 key (the command-signing key).
func Stored(ks store.KeyStore, k *kek.KEK, name string) (crypto.Signer, uint32, error) {
	fp, sealed, err := ks.Keys()
	if err != nil {
		return nil, 0, fmt.Errorf("read the key set: %w", err)
	}
	if fp != k.Fingerprint() {
		return nil, 0, fmt.Errorf("%w %s, not %s", ErrKEKMoved, fp, k.Fingerprint())
	}
	for _, sk := range sealed {
		if sk.Name != name {
			continue
		}
		b, err := k.Open(sk.Name, sk.Version, sk.Sealed)
		if err != nil {
			return nil, 0, fmt.Errorf("the database's key %s: %w", name, err)
		}
		key, err := pki.ParsePrivateKeyPEM(b)
		clear(b)
		if err != nil {
			return nil, 0, fmt.Errorf("the database's key %s: %w", name, err)
		}
		return key, sk.Version, nil
	}
	return nil, 0, fmt.Errorf("the database's key set lacks %s", name)
}

// SealNext seals key (a P-256 key) as version version of name, to replace
// the stored one with store.KeyStore.RotateKey.
func SealNext(k *kek.KEK, name string, version uint32, key crypto.Signer) (store.SealedKey, error) {
	b, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return store.SealedKey{}, err
	}
	sealed, err := k.Seal(name, version, b)
	clear(b)
	if err != nil {
		return store.SealedKey{}, err
	}
	return store.SealedKey{Name: name, Version: version, Sealed: sealed}, nil
}
