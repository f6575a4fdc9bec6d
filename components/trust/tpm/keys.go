package tpm

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// UniqueSize is the size of the value that names a node key.
const UniqueSize = 32

// akLabel is hashed into the AK template's unique field, so the AK differs
// from any other primary key made under the endorsement hierarchy.
const akLabel = "bcd attestation key v1"

// akUnique is the AK template's unique.ecc.x: sha256 of akLabel.
func akUnique() []byte {
	x := sha256.Sum256([]byte(akLabel))
	return x[:]
}

// Attributes and algorithms of eccSigningTemplate, as marshalled.
const (
	algECC       = 0x0023
	curveP256    = 0x0003
	attrFixedTPM = 1 << 1
	attrFixedPar = 1 << 4
	attrSensOrig = 1 << 5
	attrUserAuth = 1 << 6
	attrNoDA     = 1 << 10
	attrRestrict = 1 << 16
	attrSign     = 1 << 18
)

// NodeKeyTemplate is the node-key template for unique, a marshalled
// TPMT_PUBLIC: an unrestricted ECDSA P-256 (SHA-256) signing key, fixed to
// this TPM, generated inside it, used with an empty password and exempt
// from dictionary-attack lockout, created as a primary key under the owner
// hierarchy with the 32 bytes of unique as unique.ecc.x (unique.ecc.y
// empty). The TPM derives the same key from the same template for as long
// as the owner hierarchy is not cleared. Changing this template changes
// every node key; never do so.
func NodeKeyTemplate(unique [UniqueSize]byte) []byte {
	return eccSigningTemplateBytes(false, unique[:])
}

// AKTemplate is the attestation key's template, a marshalled TPMT_PUBLIC:
// a restricted ECDSA P-256 (SHA-256) signing key, otherwise as the node
// key's, created as a primary key under the endorsement hierarchy with
// sha256("bcd attestation key v1") as unique.ecc.x. Being restricted, it
// signs only structures the TPM made itself (TPMS_ATTEST) or digests the
// TPM hashed and checked do not start with TPM_GENERATED_VALUE.
func AKTemplate() []byte {
	return eccSigningTemplateBytes(true, akUnique())
}

// eccSigningTemplateBytes is the template both the node key and the AK
// start from, written field by field (TestTemplateBytesMatchGoTPM checks
// them against go-tpm's marshalling).
func eccSigningTemplateBytes(restricted bool, x []byte) []byte {
	attrs := uint32(attrFixedTPM | attrFixedPar | attrSensOrig | attrUserAuth | attrNoDA | attrSign)
	if restricted {
		attrs |= attrRestrict
	}
	c := command{}
	c.u16(algECC)
	c.u16(algSHA256) // nameAlg
	c.u32(attrs)
	c.tpm2b(nil)     // authPolicy
	c.u16(algNull)   // symmetric
	c.u16(algECDSA)  // scheme
	c.u16(algSHA256) // scheme's hash
	c.u16(curveP256)
	c.u16(algNull) // kdf
	c.tpm2b(x)     // unique.ecc.x
	c.tpm2b(nil)   // unique.ecc.y
	return c.b
}

// Key is a TPM-held ECDSA P-256 key: a node key (NodeKey) or the AK (AK).
// A node key is a crypto.Signer for TLS (tls.Certificate.PrivateKey), CSRs
// and pki.Sign. The private half never leaves the TPM.
type Key struct {
	t    *TPM
	obj  *object
	pub  *ecdsa.PublicKey
	name []byte
	ak   bool
}

// NewUnique returns a random unique for a new node key; node.key records it.
func NewUnique() ([UniqueSize]byte, error) {
	var u [UniqueSize]byte
	if _, err := rand.Read(u[:]); err != nil {
		return u, fmt.Errorf("read random unique = %w", err)
	}
	return u, nil
}

// NodeKey derives the node key named by unique under the owner hierarchy
// (NodeKeyTemplate). The same unique gives the same key every time on the
// same TPM; the caller records unique (node.key) to use the key again.
func (t *TPM) NodeKey(unique [UniqueSize]byte) (*Key, error) {
	return t.key(newObject("node-key template", RHOwner, NodeKeyTemplate(unique)), false)
}

// AK derives the attestation key under the endorsement hierarchy
// (AKTemplate). There is one AK per TPM; it changes only when the
// endorsement seed does, as the EK does.
func (t *TPM) AK() (*Key, error) {
	return t.key(newObject("AK template", RHEndorsement, AKTemplate()), true)
}

func (t *TPM) key(obj *object, ak bool) (*Key, error) {
	if err := t.derive(obj); err != nil {
		return nil, err
	}
	check := CheckNodeKeyPublic
	if ak {
		check = CheckAKPublic
	}
	pub, err := check(obj.public)
	if err != nil {
		return nil, fmt.Errorf("TPM2_CreatePrimary(%s, %s) answered a public area that is not the template's: %w",
			hierarchyName(obj.hierarchy), obj.what, err)
	}
	return &Key{t: t, obj: obj, pub: pub, name: sha256Name(obj.public), ak: ak}, nil
}

// Public returns the key's public half, an *ecdsa.PublicKey on P-256.
func (k *Key) Public() crypto.PublicKey { return k.pub }

// PublicArea returns the key's TPMT_PUBLIC as the TPM answered it; a verifier
// computes the key's name from it (Name) and checks it with
// CheckNodeKeyPublic or CheckAKPublic.
func (k *Key) PublicArea() []byte { return append([]byte(nil), k.obj.public...) }

// Name returns the key's TPM name (TPM2B_NAME contents: nameAlg || digest).
func (k *Key) Name() []byte { return append([]byte(nil), k.name...) }

// IsAK reports whether the key is the AK.
func (k *Key) IsAK() bool { return k.ak }

// Release unloads the key from the TPM. The Key stays usable: it is derived
// again at its next use.
func (k *Key) Release() error { return k.t.release(k.obj) }

// Sign signs digest, a SHA-256, SHA-384 or SHA-512 digest (32, 48 or 64
// bytes; when opts names a hash, its size must match), and returns an ASN.1
// DER ECDSA signature as crypto/ecdsa.SignASN1 does. rand is not used: the
// TPM makes its own nonce.
//
// ECDSA on P-256 signs the leftmost 256 bits of a digest (FIPS 186-5), so the
// TPM signs the first 32 bytes with the key's ECDSA-SHA256 scheme; the
// signature verifies for the whole digest with crypto/ecdsa, and TPMs without
// SHA-512 sign SHA-512 digests too.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if k.ak {
		return nil, errors.New("TPM2_Sign(AK): the AK is restricted and signs only what the TPM attests (Certify)")
	}
	switch len(digest) {
	case 32, 48, 64:
	default:
		return nil, fmt.Errorf("TPM2_Sign(node key): digest is %d bytes, want 32, 48 or 64 (SHA-256, -384, -512)", len(digest))
	}
	if opts != nil {
		if h := opts.HashFunc(); h == 0 {
			return nil, errors.New("TPM2_Sign(node key): the message is not hashed; the node key signs digests only")
		} else if h.Size() != len(digest) {
			return nil, fmt.Errorf("TPM2_Sign(node key): digest is %d bytes, but %s digests are %d", len(digest), h, h.Size())
		}
	}
	t := k.t
	t.mu.Lock()
	defer t.mu.Unlock()
	s, err := t.loadLocked(k.obj)
	if err != nil {
		return nil, err
	}
	sig, err := t.sign(s.handle, digest[:32])
	if err != nil {
		return nil, fmt.Errorf("TPM2_Sign(node key, %d-byte digest) = %w", len(digest), err)
	}
	r, sv, err := parseECDSASignature(sig)
	if err != nil {
		return nil, fmt.Errorf("TPM2_Sign(node key) answered %w", err)
	}
	der := ecdsaDER(r, sv)
	if !ecdsa.VerifyASN1(k.pub, digest, der) {
		return nil, errors.New("TPM2_Sign(node key) answered a signature that does not verify against the key")
	}
	return der, nil
}

// ecdsaDER encodes r and s (unsigned, big-endian, at most 32 bytes each:
// parseECDSASignature's bound) as the ASN.1 DER ECDSA-Sig-Value,
// SEQUENCE { r INTEGER, s INTEGER }, as crypto/ecdsa's SignASN1 answers
// (TestECDSADERMatchesASN1 compares it with encoding/asn1, which the helper
// does not link for these 20 lines). Every length fits in one byte.
func ecdsaDER(r, s []byte) []byte {
	ri, si := derInteger(r), derInteger(s)
	out := append([]byte{0x30, byte(len(ri) + len(si))}, ri...)
	return append(out, si...)
}

// derInteger is a non-negative integer's DER INTEGER: minimal bytes, and
// a leading zero when the high bit is set.
func derInteger(b []byte) []byte {
	for len(b) > 0 && b[0] == 0 {
		b = b[1:]
	}
	if len(b) == 0 || b[0]&0x80 != 0 {
		b = append([]byte{0}, b...)
	}
	return append([]byte{0x02, byte(len(b))}, b...)
}

// CheckNodeKeyPublic checks that pub (a TPMT_PUBLIC) is a node key: the
// node-key template in every field but the unique point, which must be on
// P-256. It returns the public key.
func CheckNodeKeyPublic(pub []byte) (*ecdsa.PublicKey, error) {
	ep, err := checkTemplate(pub, eccSigningTemplateBytes(false, nil))
	if err != nil {
		return nil, fmt.Errorf("not a bcd node key: %w", err)
	}
	return ep, nil
}

// CheckAKPublic checks that pub (a TPMT_PUBLIC) is a bcd AK: the AK template
// (restricted, fixed to its TPM, generated inside it, ECDSA P-256 SHA-256) in
// every field but the unique point. It returns the public key.
func CheckAKPublic(pub []byte) (*ecdsa.PublicKey, error) {
	ep, err := checkTemplate(pub, eccSigningTemplateBytes(true, nil))
	if err != nil {
		return nil, fmt.Errorf("not a bcd AK: %w", err)
	}
	return ep, nil
}

// checkTemplate checks pub against tmpl, a marshalled ECC signing template
// with an empty unique point: pub must be tmpl in every byte before the
// unique point, then a point of two 32-byte coordinates on P-256, and
// nothing after it. This is the check go-tpm's decoder and a re-encoding
// made before (parse pub, put its unique into the template, marshal, compare
// bytes), done on the bytes so that bcd helper links no reflection-based
// TPM marshalling (command.go says why).
func checkTemplate(pub, tmpl []byte) (*ecdsa.PublicKey, error) {
	prefix := tmpl[:len(tmpl)-4] // the empty unique point: two 2-byte sizes of 0
	if len(pub) < len(prefix) || string(pub[:len(prefix)]) != string(prefix) {
		return nil, errors.New("type, name algorithm, attributes, policy or parameters differ from the template")
	}
	r := reader{b: pub[len(prefix):]}
	x := r.tpm2b(maxTPM2B, "unique.ecc.x")
	y := r.tpm2b(maxTPM2B, "unique.ecc.y")
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%d trailing bytes", len(r.b)))
	}
	if r.err != nil {
		return nil, fmt.Errorf("parse TPMT_PUBLIC: %w", r.err)
	}
	if len(x) != 32 || len(y) != 32 {
		return nil, fmt.Errorf("unique point coordinates are %d and %d bytes, want 32", len(x), len(y))
	}
	return ecdsaPublic(x, y)
}

// ecdsaPublic is the P-256 point (x, y).
func ecdsaPublic(x, y []byte) (*ecdsa.PublicKey, error) {
	raw := append(append([]byte{4}, x...), y...)
	ep, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), raw)
	if err != nil {
		return nil, fmt.Errorf("unique point: %w", err)
	}
	return ep, nil
}

// sha256Name is the TPM name of a public area whose name algorithm is
// SHA-256 (every key checkTemplate accepts): 0x000b and sha256(pub).
func sha256Name(pub []byte) []byte {
	d := sha256.Sum256(pub)
	return append([]byte{0x00, 0x0b}, d[:]...)
}
