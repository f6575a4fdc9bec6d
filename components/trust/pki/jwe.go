package pki

import (
	"bytes"
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"fmt"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	jwkUseEnc = "enc"
	// MaxSealedPayload bounds the JSON payload of a sealed token.
	MaxSealedPayload = 8 << 10
	// maxCompactJWE bounds the compact JWE accepted by OpenToken: header,
	// wrapped key, IV and tag plus base64 of MaxSealedPayload fit easily.
	maxCompactJWE = 16 << 10
	maxJWKSize    = 8 << 10
)

// SealedToken is the payload sealed to the JoinService encryption key.
type SealedToken struct {
	Token     string `json:"token"`
	CSRSHA256 string `json:"csr_sha256"`
	IssuedAt  int64  `json:"iat"`
}

// GenerateEncryptionJWK returns a new private P-256 JWK for ECDH-ES+A256KW
// whose KeyID is its SPKI pin.
func GenerateEncryptionJWK() (priv *jose.JSONWebKey, err error) {
	k, err := GenerateKey()
	if err != nil {
		return nil, fmt.Errorf("generate encryption JWK: %w", err)
	}
	pin, err := Pin(k.Public())
	if err != nil {
		return nil, fmt.Errorf("generate encryption JWK: %w", err)
	}
	return &jose.JSONWebKey{
		Key:       k,
		KeyID:     pin,
		Use:       jwkUseEnc,
		Algorithm: string(jose.ECDH_ES_A256KW),
	}, nil
}

// PublicJWK returns the public half of priv, keeping KeyID, Use and
// Algorithm. It returns an empty JWK if priv is nil or not asymmetric.
func PublicJWK(priv *jose.JSONWebKey) jose.JSONWebKey {
	if priv == nil {
		return jose.JSONWebKey{}
	}
	return priv.Public()
}

// ParsePublicJWK parses a JSON JWK that must be an EC P-256 public key meant
// for encryption: private material is refused, "use" must be "enc" or absent,
// "alg" must be ECDH-ES+A256KW or absent, and a "kid", if present, must equal
// the key's SPKI pin.
func ParsePublicJWK(b []byte) (*jose.JSONWebKey, error) {
	if len(b) > maxJWKSize {
		return nil, fmt.Errorf("parse public JWK: %d bytes exceeds limit of %d", len(b), maxJWKSize)
	}
	var k jose.JSONWebKey
	if err := json.Unmarshal(b, &k); err != nil {
		// Do not wrap: decoder errors may quote input, which could hold a
		// private key that was sent by mistake.
		return nil, errors.New("parse public JWK: malformed JWK JSON")
	}
	if !k.IsPublic() {
		if k.Key != nil {
			return nil, errors.New("parse public JWK: JWK contains private or symmetric key material")
		}
		return nil, errors.New("parse public JWK: no key")
	}
	if _, err := p256Public(k.Key); err != nil {
		return nil, fmt.Errorf("parse public JWK: %w", err)
	}
	if k.Use != "" && k.Use != jwkUseEnc {
		return nil, fmt.Errorf("parse public JWK: use %q, want %q", truncate(k.Use, 20), jwkUseEnc)
	}
	if k.Algorithm != "" && k.Algorithm != string(jose.ECDH_ES_A256KW) {
		return nil, fmt.Errorf("parse public JWK: alg %q, want %q", truncate(k.Algorithm, 40), jose.ECDH_ES_A256KW)
	}
	if k.KeyID != "" {
		pin, err := JWKPin(&k)
		if err != nil {
			return nil, fmt.Errorf("parse public JWK: %w", err)
		}
		if k.KeyID != pin {
			return nil, errors.New("parse public JWK: kid is not the key's SPKI pin")
		}
	}
	return &k, nil
}

// JWKPin returns the SPKI pin of the key's public half.
func JWKPin(k *jose.JSONWebKey) (string, error) {
	if k == nil || k.Key == nil {
		return "", errors.New("pin JWK: no key")
	}
	pub := k.Public()
	if pub.Key == nil || !pub.IsPublic() {
		return "", errors.New("pin JWK: not an asymmetric key")
	}
	return Pin(pub.Key)
}

// SealToken encrypts t to pub as a compact JWE (ECDH-ES+A256KW, A256GCM).
func SealToken(pub *jose.JSONWebKey, t SealedToken) (string, error) {
	if pub == nil || pub.Key == nil {
		return "", errors.New("seal token: no recipient key")
	}
	half := pub.Public()
	ep, err := p256Public(half.Key)
	if err != nil {
		return "", fmt.Errorf("seal token: recipient %w", err)
	}
	if t.Token == "" {
		return "", errors.New("seal token: token is empty")
	}
	payload, err := json.Marshal(t)
	if err != nil {
		return "", errors.New("seal token: encode payload")
	}
	if len(payload) > MaxSealedPayload {
		return "", fmt.Errorf("seal token: payload is %d bytes, limit %d", len(payload), MaxSealedPayload)
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{
		Algorithm: jose.ECDH_ES_A256KW,
		Key:       ep,
		KeyID:     pub.KeyID,
	}, nil)
	if err != nil {
		return "", fmt.Errorf("seal token: create encrypter: %w", err)
	}
	obj, err := enc.Encrypt(payload)
	if err != nil {
		return "", fmt.Errorf("seal token: encrypt: %w", err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("seal token: serialize: %w", err)
	}
	return out, nil
}

// OpenToken decrypts a compact JWE made by SealToken. Only ECDH-ES+A256KW with
// A256GCM is accepted, compression is refused, the payload is limited to
// MaxSealedPayload and must be strict JSON for SealedToken. Errors never
// include the token.
func OpenToken(priv *jose.JSONWebKey, compact string) (SealedToken, error) {
	if priv == nil {
		return SealedToken{}, errors.New("open token: no decryption key")
	}
	ek, ok := priv.Key.(*ecdsa.PrivateKey)
	if !ok || ek == nil {
		return SealedToken{}, errors.New("open token: decryption key is not an ECDSA P-256 private key")
	}
	if _, err := p256Public(ek.Public()); err != nil {
		return SealedToken{}, fmt.Errorf("open token: decryption %w", err)
	}
	if compact == "" {
		return SealedToken{}, errors.New("open token: empty JWE")
	}
	if len(compact) > maxCompactJWE {
		return SealedToken{}, fmt.Errorf("open token: JWE is %d bytes, limit %d", len(compact), maxCompactJWE)
	}
	obj, err := jose.ParseEncryptedCompact(compact,
		[]jose.KeyAlgorithm{jose.ECDH_ES_A256KW},
		[]jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return SealedToken{}, fmt.Errorf("open token: parse JWE: %w", err)
	}
	if _, ok := obj.Header.ExtraHeaders[jose.HeaderKey("zip")]; ok {
		return SealedToken{}, errors.New("open token: compressed JWE refused")
	}
	if obj.Header.KeyID != "" && priv.KeyID != "" && obj.Header.KeyID != priv.KeyID {
		return SealedToken{}, errors.New("open token: JWE is sealed to a different key (kid mismatch)")
	}
	pt, err := obj.Decrypt(ek)
	if err != nil {
		return SealedToken{}, fmt.Errorf("open token: decrypt: %w", err)
	}
	if len(pt) > MaxSealedPayload {
		return SealedToken{}, fmt.Errorf("open token: payload is %d bytes, limit %d", len(pt), MaxSealedPayload)
	}
	t, err := decodeSealed(pt)
	if err != nil {
		return SealedToken{}, fmt.Errorf("open token: %w", err)
	}
	return t, nil
}

// decodeSealed strictly decodes a SealedToken. Its errors are built here and
// never wrap decoder errors, which can quote bytes of the payload.
func decodeSealed(pt []byte) (SealedToken, error) {
	var t SealedToken
	dec := json.NewDecoder(bytes.NewReader(pt))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr):
			return SealedToken{}, fmt.Errorf("payload field %q has the wrong JSON type", typeErr.Field)
		default:
			return SealedToken{}, errors.New("payload is not a valid sealed token JSON object")
		}
	}
	if len(bytes.TrimSpace(pt[dec.InputOffset():])) != 0 {
		return SealedToken{}, errors.New("payload has trailing data after the JSON object")
	}
	if t.Token == "" {
		return SealedToken{}, errors.New("payload has an empty token")
	}
	return t, nil
}
