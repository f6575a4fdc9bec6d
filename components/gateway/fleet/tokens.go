package fleet

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
)

func RandomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// NewToken makes and stores a join token and returns its string, which is
// shown once and stored only as a hash.
func (s *Fleet) NewToken(role, site string, uses int, ttl time.Duration) (string, store.Token, error) {
	if role != "node" && role != "site" {
		return "", store.Token{}, fmt.Errorf("role must be node or site")
	}
	if uses < 1 {
		return "", store.Token{}, fmt.Errorf("uses must be at least 1")
	}
	if site == "" {
		site = "lab"
	}
	t := store.Token{Role: role, Site: site, Uses: uses}
	if ttl > 0 {
		t.ExpiresAt = s.now().Add(ttl).UTC()
	}
	tok, t, err := s.mintToken(t)
	if err != nil {
		return "", t, err
	}
	s.log.Info("join token created", "token_id", t.ID, "role", role, "site", site, "uses", uses)
	return tok, t, nil
}

// mintToken gives t a new id and secret, stores it with the secret's hash
// only, and returns the token string bcjt_<id>_<secret>.
func (s *Fleet) mintToken(t store.Token) (string, store.Token, error) {
	secret := RandomID(20)
	t.ID, t.Hash, t.CreatedAt = "jt"+RandomID(8), store.HashSecret(secret), s.now().UTC()
	if err := s.store.PutToken(t); err != nil {
		return "", t, err
	}
	return "bcjt_" + t.ID + "_" + secret, t, nil
}
