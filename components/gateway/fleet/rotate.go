package fleet

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/trust/pki"
)

// OldCommandKeyPub is where a rotation leaves the replaced key's public
// half in the data directory, for `bcgw trust remove-root --key` once no
// command it signed is waiting any more.
const OldCommandKeyPub = "command-signing.old.pub"

// commandKey is bcgw's own command-signing key (nil: none).
func (s *Fleet) commandKey() crypto.Signer {
	s.cmdKeyMu.RLock()
	defer s.cmdKeyMu.RUnlock()
	return s.cmdKey
}

// RotateCommandKey replaces bcgw's own command-signing key with a new one
// without any node joining again: the new key becomes a root of the trust
// bundle next to the old one (a new version; live sessions are drained
// and every agent takes it at its next Welcome), the key file is
// replaced, and what bcgw signs from then on it signs with the new key.
// The old key stays a root, since commands it signed may still wait for
// their node; its public half is left in the data directory, to be
// removed as a root later. Only a key bcgw made in its data directory is
// rotated: not one given with --command-key FILE, and not on a database
// yet.
func (s *Fleet) RotateCommandKey() (adminapi.KeyRotation, error) {
	s.cmdKeyMu.Lock()
	defer s.cmdKeyMu.Unlock()
	old := s.cmdKey
	if old == nil {
		return adminapi.KeyRotation{}, errors.New("this gateway runs with --command-key none: it has no key of its own to rotate")
	}
	dir, ok := s.keyFiles.(keys.Dir)
	if !ok {
		return adminapi.KeyRotation{}, errors.New("rotating the command-signing key of gateways on a database is not done yet (docs/bcgw.md)")
	}
	oldSPKI, err := x509.MarshalPKIXPublicKey(old.Public())
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	onDisk, err := dir.Read(keys.CommandKeyFile)
	if err != nil {
		return adminapi.KeyRotation{}, fmt.Errorf("read %s: %w", dir.Where(keys.CommandKeyFile), err)
	}
	if k, err := pki.ParsePrivateKeyPEM(onDisk); err != nil || !publicEqual(k.Public(), oldSPKI) {
		return adminapi.KeyRotation{}, fmt.Errorf("this gateway's command-signing key is not %s (given with --command-key): rotate that key where it is made, with bcgw trust add-root and remove-root",
			dir.Where(keys.CommandKeyFile))
	}
	next, err := pki.GenerateKey()
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	nextPEM, err := pki.MarshalPrivateKeyPEM(next)
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	nextSPKI, err := x509.MarshalPKIXPublicKey(next.Public())
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: oldSPKI})
	if err := dir.Write(OldCommandKeyPub, pub, 0o644); err != nil {
		return adminapi.KeyRotation{}, fmt.Errorf("write %s: %w", dir.Where(OldCommandKeyPub), err)
	}
	// The new key is a root before anything is signed with it; the drain
	// this bundle change sends makes every agent take it at once.
	ch, err := s.AddTrustRoot(nextSPKI)
	if err != nil {
		return adminapi.KeyRotation{}, fmt.Errorf("add the new key as a root: %w", err)
	}
	if err := dir.Write(keys.CommandKeyFile, nextPEM, 0o600); err != nil {
		return adminapi.KeyRotation{}, fmt.Errorf("the new key is a root (bundle version %d) but was not stored, so bcgw signs with the old one still: %w", ch.Version, err)
	}
	s.cmdKey = next
	r := adminapi.KeyRotation{OldPin: adminapi.PinOfSPKI(oldSPKI), NewPin: adminapi.PinOfSPKI(nextSPKI), Version: ch.Version,
		OldPublicKey: dir.Where(OldCommandKeyPub)}
	s.log.Info("command-signing key rotated", "old_pin", r.OldPin, "new_pin", r.NewPin, "trust_version", r.Version)
	return r, nil
}

func publicEqual(k crypto.PublicKey, spki []byte) bool {
	b, err := x509.MarshalPKIXPublicKey(k)
	return err == nil && bytes.Equal(b, spki)
}
