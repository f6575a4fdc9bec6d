package fleet

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
)

// OldCommandKeyPub is where a rotation leaves the replaced key's public
// half in the data directory, for `bcgw trust remove-root --key` once no
// command it signed is waiting any more.
const OldCommandKeyPub = "command-signing.old.pub"

// keySwitchAfter is how long a gateway on a database goes on signing with
// the old key once it holds (and drained its sessions for) the bundle
// naming the new one: time for the other gateways to take that bundle
// from the trust notice and drain theirs, so no agent still holding the
// older bundle gets a command signed with the new key.
var keySwitchAfter = time.Second

// commandKey is bcgw's own command-signing key (nil: none).
func (s *Fleet) commandKey() crypto.Signer {
	s.cmdKeyMu.RLock()
	defer s.cmdKeyMu.RUnlock()
	return s.cmdKey
}

// commandKeyVersion is the command-signing key with its stored version
// on a database (0: not the key set's).
func (s *Fleet) commandKeyVersion() (crypto.Signer, uint32) {
	s.cmdKeyMu.RLock()
	defer s.cmdKeyMu.RUnlock()
	return s.cmdKey, s.cmdKeyVersion
}

func (s *Fleet) setCommandKey(k crypto.Signer, version uint32) {
	s.cmdKeyMu.Lock()
	s.cmdKey, s.cmdKeyVersion = k, version
	s.cmdKeyMu.Unlock()
}

// RotateCommandKey replaces bcgw's own command-signing key with a new one
// without any node joining again: the new key becomes a root of the trust
// bundle next to the old one (a new version; live sessions are drained
// and every agent takes it at its next Welcome), the key is stored, and
// what bcgw signs from then on it signs with the new key. The old key
// stays a root, since commands it signed may still wait for their node;
// its public half is left in the data directory, to be removed as a root
// later. Only a key bcgw made is rotated: the data directory's, or on a
// database the key set's (rotateShared), not one given with --command-key
// FILE.
func (s *Fleet) RotateCommandKey() (adminapi.KeyRotation, error) {
	s.rotateMu.Lock()
	defer s.rotateMu.Unlock()
	old, version := s.commandKeyVersion()
	if old == nil {
		return adminapi.KeyRotation{}, errors.New("this gateway runs with --command-key none: it has no key of its own to rotate")
	}
	oldSPKI, err := x509.MarshalPKIXPublicKey(old.Public())
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	dir, ok := s.keyFiles.(keys.Dir)
	if !ok {
		if version == 0 {
			return adminapi.KeyRotation{}, errors.New("this gateway's command-signing key is not the database's (given with --command-key): " +
				"rotate that key where it is made, with bcgw trust add-root and remove-root")
		}
		return s.rotateShared(oldSPKI, version)
	}
	onDisk, err := dir.Read(keys.CommandKeyFile)
	if err != nil {
		return adminapi.KeyRotation{}, fmt.Errorf("read %s: %w", dir.Where(keys.CommandKeyFile), err)
	}
	if k, err := pki.ParsePrivateKeyPEM(onDisk); err != nil || !publicEqual(k.Public(), oldSPKI) {
		return adminapi.KeyRotation{}, fmt.Errorf("this gateway's command-signing key is not %s (given with --command-key): rotate that key where it is made, with bcgw trust add-root and remove-root",
			dir.Where(keys.CommandKeyFile))
	}
	next, nextSPKI, err := newCommandKey()
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	nextPEM, err := pki.MarshalPrivateKeyPEM(next)
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	oldPub, err := s.keepOldPublic(oldSPKI)
	if err != nil {
		return adminapi.KeyRotation{}, err
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
	s.setCommandKey(next, 0)
	return s.rotated(oldSPKI, nextSPKI, ch.Version, oldPub), nil
}

// rotateShared rotates the command-signing key every gateway on the
// database signs with. The new key, sealed as the next version, and the
// trust bundle naming it as a root are stored in one transaction
// (store.KeyStore.RotateKey) over the key version and bundle this gateway
// holds: of two gateways rotating at once one wins and the other changes
// nothing, and a gateway that stops at any point leaves the old key and
// bundle or the new ones, never one without the other. This gateway then
// drains its sessions and, keySwitchAfter later, signs with the new key;
// the others take it after their own drain, at the trust notice or at
// their next sweep (reloadCommandKey).
func (s *Fleet) rotateShared(oldSPKI []byte, version uint32) (adminapi.KeyRotation, error) {
	if err := s.kekCurrent(); err != nil {
		return adminapi.KeyRotation{}, err
	}
	kk, ks := s.cfg.KEK, s.cfg.KeyStore
	next, nextSPKI, err := newCommandKey()
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	sealed, err := keys.SealNext(kk, keys.CommandKeyFile, version+1, next)
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	oldPub, err := s.keepOldPublic(oldSPKI)
	if err != nil {
		return adminapi.KeyRotation{}, err
	}
	s.trust.mu.Lock()
	var doc bundle.Document
	for attempt := 1; ; attempt++ {
		if _, err := s.reloadTrustLocked(); err != nil {
			s.trust.mu.Unlock()
			return adminapi.KeyRotation{}, err
		}
		doc = s.trust.doc
		if len(doc.CommandSigningRoots) >= intent.MaxRoots {
			s.trust.mu.Unlock()
			return adminapi.KeyRotation{}, fmt.Errorf("the trust bundle names %d command-signing roots already, the most it may: remove one first", intent.MaxRoots)
		}
		doc.CommandSigningRoots = append(slices.Clone(doc.CommandSigningRoots), nextSPKI)
		doc.Version++
		tb, b, err := s.signTrust(doc)
		if err != nil {
			s.trust.mu.Unlock()
			return adminapi.KeyRotation{}, err
		}
		done, err := ks.RotateKey(kk.Fingerprint(), sealed, metaTrustBundle, s.trust.raw, b)
		if err != nil {
			s.trust.mu.Unlock()
			return adminapi.KeyRotation{}, fmt.Errorf("store the new key and trust bundle version %d: %w", doc.Version, err)
		}
		if done {
			s.trust.doc, s.trust.tb, s.trust.raw = doc, tb, b
			break
		}
		// Why not: another rotation, a rotated key-encryption key, or
		// only the bundle changed (then again, over that one).
		_, stored, err := keys.Stored(ks, kk, keys.CommandKeyFile)
		switch {
		case err != nil:
			err = fmt.Errorf("the key set changed during the rotation: %w", err)
		case stored != version:
			err = fmt.Errorf("the command-signing key was rotated through another gateway meanwhile (now version %d): "+
				"nothing was changed here; bcgw trust show names the key signing now", stored)
		case attempt == trustAttempts:
			err = fmt.Errorf("store trust bundle version %d: %w", doc.Version, errTrustMoved)
		}
		if err != nil {
			s.trust.mu.Unlock()
			return adminapi.KeyRotation{}, err
		}
	}
	s.trust.mu.Unlock()
	s.Notify(store.Notice{Kind: store.NoticeTrust})
	n := s.hub.DrainLive("trust bundle changed", trustDrainRedial)
	s.log.Info("trust bundle changed", "version", doc.Version, "roots", len(doc.CommandSigningRoots), "sessions_drained", n)
	time.Sleep(keySwitchAfter)
	s.setCommandKey(next, version+1)
	return s.rotated(oldSPKI, nextSPKI, doc.Version, oldPub), nil
}

// loadSharedCommandKey, at the start on a database, takes the key set's
// command-signing key as stored now (a rotation may have stored a new
// version since the set was read) and its version, when bcgw signs with
// the key set's key.
func (s *Fleet) loadSharedCommandKey() error {
	ks, kk := s.cfg.KeyStore, s.cfg.KEK
	own := s.commandKey()
	if ks == nil || kk == nil || own == nil {
		return nil
	}
	b, err := s.keyFiles.Read(keys.CommandKeyFile)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.keyFiles.Where(keys.CommandKeyFile), err)
	}
	if k, err := pki.ParsePrivateKeyPEM(b); err != nil || !publicEqual(k.Public(), mustSPKI(own)) {
		return nil // --command-key FILE
	}
	k, v, err := keys.Stored(ks, kk, keys.CommandKeyFile)
	if err != nil {
		return err
	}
	s.setCommandKey(k, v)
	return nil
}

// reloadCommandKey takes the key set's command-signing key when another
// gateway rotated it: once the bundle this gateway holds names it as a
// root, so its sessions were drained for that bundle (reloadTrust runs it
// after the drain; afterDrain: keySwitchAfter is waited first). It runs
// at every trust notice, at every sweep of the shared store and after the
// notices' listener reconnected.
func (s *Fleet) reloadCommandKey(afterDrain bool) {
	s.rotateMu.Lock()
	defer s.rotateMu.Unlock()
	_, held := s.commandKeyVersion()
	if held == 0 || s.cfg.KeyStore == nil || s.cfg.KEK == nil {
		return
	}
	k, v, err := keys.Stored(s.cfg.KeyStore, s.cfg.KEK, keys.CommandKeyFile)
	if err != nil {
		if !errors.Is(err, keys.ErrKEKMoved) { // kekCurrent tells that one
			s.log.Warn("the database's command-signing key not read", "err", err)
		}
		return
	}
	if v <= held {
		return
	}
	spki := mustSPKI(k)
	s.trust.mu.Lock()
	isRoot := slices.ContainsFunc(s.trust.doc.CommandSigningRoots, func(r []byte) bool { return bytes.Equal(r, spki) })
	s.trust.mu.Unlock()
	if !isRoot {
		return // the bundle naming it comes with its notice or the next sweep
	}
	if afterDrain {
		time.Sleep(keySwitchAfter)
	}
	s.setCommandKey(k, v)
	s.log.Info("command-signing key rotated through another gateway; signing with it from now on", "pin", adminapi.PinOfSPKI(spki), "version", v)
}

// newCommandKey makes a command-signing key and its SPKI DER.
func newCommandKey() (crypto.Signer, []byte, error) {
	next, err := pki.GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(next.Public())
	return next, spki, err
}

// keepOldPublic writes the replaced key's public half to the data
// directory (OldCommandKeyPub) and returns its path.
func (s *Fleet) keepOldPublic(oldSPKI []byte) (string, error) {
	dir := keys.Dir(s.cfg.DataDir)
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: oldSPKI})
	if err := dir.Write(OldCommandKeyPub, pub, 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", dir.Where(OldCommandKeyPub), err)
	}
	return dir.Where(OldCommandKeyPub), nil
}

// rotated logs a rotation and answers it.
func (s *Fleet) rotated(oldSPKI, nextSPKI []byte, version uint64, oldPub string) adminapi.KeyRotation {
	r := adminapi.KeyRotation{OldPin: adminapi.PinOfSPKI(oldSPKI), NewPin: adminapi.PinOfSPKI(nextSPKI), Version: version, OldPublicKey: oldPub}
	s.log.Info("command-signing key rotated", "old_pin", r.OldPin, "new_pin", r.NewPin, "trust_version", r.Version)
	return r
}

// mustSPKI is k's public half as SPKI DER (nil for a key x509 cannot
// marshal, which no key made here is).
func mustSPKI(k crypto.Signer) []byte {
	b, _ := x509.MarshalPKIXPublicKey(k.Public())
	return b
}

func publicEqual(k crypto.PublicKey, spki []byte) bool {
	b, err := x509.MarshalPKIXPublicKey(k)
	return err == nil && bytes.Equal(b, spki)
}
