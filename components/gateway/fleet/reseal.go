package fleet

import (
	"fmt"

	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/store"
)

// ResealSecrets seals every operator secret of a database anew under
// next (a rotation of the fleet's key-encryption key, bcgw kek rotate):
// each value sealed under old is replaced only while it is the value
// read (SwapMeta); one already sealed under next is left. Run it before
// the key set is resealed (keys.Reseal), whose fingerprint is what
// gateways check, so a rotation stopped half way is run again whole.
func ResealSecrets(st store.Store, old, next *kek.KEK) (int, error) {
	vals, err := st.MetaPrefix(opSecretPrefix)
	if err != nil {
		return 0, fmt.Errorf("read the operator secrets: %w", err)
	}
	n := 0
	for key, sealed := range vals {
		v, err := old.Open(key, 1, sealed)
		if err != nil {
			if _, err2 := next.Open(key, 1, sealed); err2 == nil {
				continue // resealed by an earlier run
			}
			return n, fmt.Errorf("operator secret %s opens under neither key-encryption key: %w", key, err)
		}
		s, err := next.Seal(key, 1, v)
		clear(v)
		if err != nil {
			return n, err
		}
		ok, err := st.SwapMeta(key, sealed, s)
		if err != nil {
			return n, fmt.Errorf("store operator secret %s: %w", key, err)
		}
		if !ok {
			return n, fmt.Errorf("operator secret %s changed while it was resealed: run the rotation again", key)
		}
		n++
	}
	return n, nil
}

// kekCurrent checks, on a database, that the stored keys are still sealed
// under this gateway's key-encryption key: after a rotation a gateway not
// yet restarted with the new one must not seal secrets under the old.
func (s *Fleet) kekCurrent() error {
	ks := s.cfg.KeyStore
	if s.cfg.KEK == nil || ks == nil {
		return nil
	}
	fp, _, err := ks.Keys()
	if err != nil {
		return fmt.Errorf("read the key set's key-encryption key: %w", err)
	}
	if fp != s.cfg.KEK.Fingerprint() {
		return fmt.Errorf("the fleet's key-encryption key was rotated to %s; this gateway still runs with %s: restart it with the new one", fp, s.cfg.KEK.Fingerprint())
	}
	return nil
}
