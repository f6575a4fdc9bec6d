package agentsvc

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/gateway/store"
)

// discoveryAssertion is what a site agent signs about a machine it
// prepared (components/boot/sitekinds writes it).
type discoveryAssertion struct {
	Issuer      string `json:"iss"`
	Site        string `json:"site"`
	MAC         string `json:"mac"`
	TokenSHA256 string `json:"token_sha256"`
	IssuedAt    int64  `json:"iat"`
	Expires     int64  `json:"exp"`
}

// checkAssertion verifies a ramdisk's discovery assertion: signed (ES256)
// by the key of a site agent of the token's site that is not revoked, for
// this token and the MAC the token was minted for, and not expired.
func (s *Service) checkAssertion(compact, token string, tok store.Token) error {
	if compact == "" {
		return errors.New("missing")
	}
	jws, err := jose.ParseSigned(compact, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		return errors.New("not a compact ES256 JWS")
	}
	// Read the issuer before the signature is checked, only to find the
	// key; nothing else is trusted until Verify.
	var claimed discoveryAssertion
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &claimed); err != nil {
		return errors.New("payload is not an assertion")
	}
	site, err := s.store.Node(claimed.Issuer)
	if err != nil || site.Role != "site" || site.Revoked {
		return errors.New("not issued by a site agent of this gateway")
	}
	var payload []byte
	for _, der := range [][]byte{site.PublicKey, site.PrevPublicKey} {
		if len(der) == 0 {
			continue
		}
		pub, err := x509.ParsePKIXPublicKey(der)
		if err != nil {
			continue
		}
		if payload, err = jws.Verify(pub); err == nil {
			break
		}
		payload = nil
	}
	if payload == nil {
		return errors.New("signature does not verify with the site agent's key")
	}
	var a discoveryAssertion
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return fmt.Errorf("payload: %v", err)
	}
	sum := sha256.Sum256([]byte(token))
	switch {
	case a.Site != site.Site || tok.Site != site.Site:
		return errors.New("issued by a site agent of another site")
	case tok.MAC == "" || !strings.EqualFold(a.MAC, tok.MAC):
		return errors.New("names another machine than the token")
	case a.TokenSHA256 != hex.EncodeToString(sum[:]):
		return errors.New("made for another token")
	case s.now().After(time.Unix(a.Expires, 0)):
		return errors.New("expired")
	}
	return nil
}
