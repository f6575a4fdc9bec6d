// Package rootsig is what the root half (bcd helper) verifies on its own,
// so that it takes nothing on the node account's word: the signed join
// record bcd join leaves in root's directory, a trust bundle under the
// pinned join-signing key, and a desired state's signature under the
// bundle's command-signing roots, down to one section's bytes.
//
// A desired state's signature (purpose bcd/desired-state/v1, message
// version 2) covers, besides the frame's own fields, the SHA-256 of every
// section of the full spec the frame makes, each over its canonical JSON.
// So a section of a spec that arrived as a patch can be shown to root
// alone: the node sends the section's bytes and the signed fields, root
// hashes the section and checks the signature, with no copy of the spec,
// no merge patch and no protobuf (docs/decisions.md, "Root verifies
// sections, not specs"). components/trust/intent builds the same message
// for the agent and the gateway.
//
// The package links only the standard library and es256: no crypto/x509,
// no protobuf, no TLS, so bcd-helper stays within its budget.
package rootsig

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/better-compute/bcd/components/base/strictjson"
	"github.com/better-compute/bcd/components/trust/pki/es256"
)

// Signature purposes, as components/trust/pki, bundle and intent use them.
const (
	PurposeDesiredState = "bcd/desired-state/v1"
	PurposeTrustBundle  = "bcd/trust-bundle/v1"
	PurposeJoinResponse = "bcd/join-response/v1"
)

// DesiredVersion is the version of the desired-state message.
const DesiredVersion = 2

// Limits.
const (
	// SignatureSize is a signature field: the signer's key id (SHA-256
	// of its SPKI) and the 64-byte ES256 signature.
	SignatureSize = sha256.Size + es256.SignatureSize
	// MaxRoots bounds the command-signing roots of a bundle.
	MaxRoots = 16
	// MaxBundle bounds a trust bundle document.
	MaxBundle = 64 << 10
	// MaxSections bounds the sections a proof names.
	MaxSections = 16
)

// Errors a caller tells apart.
var (
	// ErrUnsigned: a proof without a signature.
	ErrUnsigned = errors.New("UNSIGNED")
	// ErrBadSignature: a signature by a key that is not a root, or over
	// other fields.
	ErrBadSignature = errors.New("BAD_SIGNATURE")
)

// desiredMessage is what a desired state's signature covers (JSON of a
// struct: fields in declaration order, map keys sorted).
type desiredMessage struct {
	V              int               `json:"v"`
	NodeID         string            `json:"node_id"`
	Generation     uint64            `json:"generation"`
	Patch          bool              `json:"patch"`
	BaseGeneration uint64            `json:"base_generation"`
	SpecSHA256     []byte            `json:"spec_sha256"`
	Sections       map[string][]byte `json:"sections"`
}

// DesiredMessage returns the bytes a desired state's signature covers:
// the frame's fields (specSHA256 is the SHA-256 of the frame's spec
// bytes, full or patch) and sections, each section of the full spec the
// frame makes to the SHA-256 of its canonical JSON (SectionDigests).
func DesiredMessage(nodeID string, generation uint64, patch bool, base uint64, specSHA256 []byte, sections map[string][]byte) []byte {
	if sections == nil {
		sections = map[string][]byte{}
	}
	b, _ := json.Marshal(desiredMessage{V: DesiredVersion, NodeID: nodeID, Generation: generation, Patch: patch,
		BaseGeneration: base, SpecSHA256: specSHA256, Sections: sections})
	return b
}

// Canonical is a JSON value in the one form both sides hash: decoded
// (numbers kept as written) and encoded again by encoding/json, so object
// keys are sorted, whitespace is gone and strings are escaped one way.
func Canonical(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("section is not JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("section has data after its JSON value")
	}
	return json.Marshal(v)
}

// SectionDigest is the SHA-256 of a section's canonical JSON.
func SectionDigest(body []byte) ([]byte, error) {
	c, err := Canonical(body)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(c)
	return sum[:], nil
}

// SectionDigests maps each section of a full spec to its SectionDigest.
func SectionDigests(spec map[string]json.RawMessage) (map[string][]byte, error) {
	out := make(map[string][]byte, len(spec))
	for name, body := range spec {
		d, err := SectionDigest(body)
		if err != nil {
			return nil, fmt.Errorf("section %s: %w", name, err)
		}
		out[name] = d
	}
	return out, nil
}

// KeyID is the SHA-256 of a key's SPKI DER: the first bytes of a
// signature field, and what a pin names.
func KeyID(spki []byte) [32]byte { return sha256.Sum256(spki) }

// Pin is the sha256/<base64> pin of a key's SPKI DER.
func Pin(spki []byte) string {
	id := KeyID(spki)
	return es256.PinPrefix + base64.StdEncoding.EncodeToString(id[:])
}

// Proof is what the node shows root of the spec it holds: the signed
// fields of the frame that made it, the digests of the full spec's
// sections, the signature, and the trust bundle it verified it under.
// Root checks a section's bytes against it with Roots.VerifySection.
type Proof struct {
	NodeID         string            `json:"node_id"`
	Generation     uint64            `json:"generation"`
	Patch          bool              `json:"patch"`
	BaseGeneration uint64            `json:"base_generation"`
	SpecSHA256     []byte            `json:"spec_sha256"`
	Sections       map[string][]byte `json:"sections"`
	Signature      []byte            `json:"signature"`
	// Signer is the SPKI DER of the key that signed, for a root that
	// pins its roots by digest ([helper] command_root_sha256); optional.
	Signer []byte `json:"signer,omitempty"`
	// Bundle is the trust bundle the node holds, for root to take when
	// it is newer than root's (nil: none held).
	Bundle *Bundle `json:"bundle,omitempty"`
}

// DecodeProof reads a proof strictly: one JSON object, no unknown field,
// sane sizes.
func DecodeProof(b []byte) (Proof, error) {
	var p Proof
	if err := strictjson.Decode(b, &p); err != nil {
		return p, fmt.Errorf("proof: %w", err)
	}
	if p.NodeID == "" || len(p.NodeID) > 256 || p.Generation == 0 {
		return p, errors.New("proof: no node id or generation")
	}
	if len(p.SpecSHA256) != sha256.Size {
		return p, errors.New("proof: spec_sha256 is not a SHA-256")
	}
	if len(p.Sections) > MaxSections {
		return p, fmt.Errorf("proof: %d sections; at most %d", len(p.Sections), MaxSections)
	}
	for name, d := range p.Sections {
		if len(d) != sha256.Size || name == "" || len(name) > 64 {
			return p, fmt.Errorf("proof: section %q: digest is not a SHA-256", name)
		}
	}
	if len(p.Signature) != 0 && len(p.Signature) != SignatureSize {
		return p, fmt.Errorf("proof: signature is %d bytes; want %d", len(p.Signature), SignatureSize)
	}
	return p, nil
}

// Message is the signed message of p.
func (p Proof) Message() []byte {
	return DesiredMessage(p.NodeID, p.Generation, p.Patch, p.BaseGeneration, p.SpecSHA256, p.Sections)
}

// Roots are command-signing roots by key id.
type Roots map[[32]byte][]byte

// ParseRoots checks each SPKI DER (P-256 only) and indexes it.
func ParseRoots(spkis [][]byte) (Roots, error) {
	if len(spkis) > MaxRoots {
		return nil, fmt.Errorf("%d command-signing roots; at most %d", len(spkis), MaxRoots)
	}
	r := Roots{}
	for i, k := range spkis {
		if _, err := es256.ParseSPKI(k); err != nil {
			return nil, fmt.Errorf("command-signing root %d: %w", i, err)
		}
		r[KeyID(k)] = k
	}
	return r, nil
}

// Verify checks sig (key id and ES256) for purpose over msg by one of r.
func (r Roots) Verify(purpose string, msg, sig []byte) error {
	if len(sig) == 0 {
		return ErrUnsigned
	}
	if len(sig) != SignatureSize {
		return fmt.Errorf("%w: signature is %d bytes; want %d", ErrBadSignature, len(sig), SignatureSize)
	}
	var id [32]byte
	copy(id[:], sig[:sha256.Size])
	spki, ok := r[id]
	if !ok {
		return fmt.Errorf("%w: signed by a key that is not a command-signing root root holds", ErrBadSignature)
	}
	pub, err := es256.ParseSPKI(spki)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	if err := es256.Verify(pub, purpose, msg, sig[sha256.Size:]); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return nil
}

// VerifySection checks that p is signed by one of r and that body is
// section name of the spec it signs: its digest is the one signed, or,
// for an empty body, the spec has no such section.
func (r Roots) VerifySection(p Proof, name string, body []byte) error {
	if err := r.Verify(PurposeDesiredState, p.Message(), p.Signature); err != nil {
		return err
	}
	want, named := p.Sections[name]
	if len(bytes.TrimSpace(body)) == 0 {
		if named {
			return fmt.Errorf("the signed spec has a %s section, but the request carries none", name)
		}
		return nil
	}
	if !named {
		return fmt.Errorf("the signed spec has no %s section, but the request carries one", name)
	}
	got, err := SectionDigest(body)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("the %s section differs from the one the spec's signature covers", name)
	}
	return nil
}

// Bundle is a trust bundle as signed: the document, the SPKI DER of the
// key that signed it (the join-signing key) and its ES256 signature.
type Bundle struct {
	Document   []byte `json:"document"`
	SigningKey []byte `json:"signing_key"`
	Signature  []byte `json:"signature"`
}

// BundleDoc is what root reads of a bundle document.
type BundleDoc struct {
	Version uint64
	Roots   Roots
}

// VerifyBundle checks b's signing key against pin (sha256/<base64>), its
// signature, and reads its document: a version and at most MaxRoots
// P-256 roots. The approver set is the agent's business, not root's.
func VerifyBundle(b Bundle, pin string) (BundleDoc, error) {
	if err := MatchPin(pin, b.SigningKey); err != nil {
		return BundleDoc{}, fmt.Errorf("trust bundle: %w", err)
	}
	pub, err := es256.ParseSPKI(b.SigningKey)
	if err != nil {
		return BundleDoc{}, fmt.Errorf("trust bundle: signing key: %w", err)
	}
	if len(b.Document) > MaxBundle {
		return BundleDoc{}, fmt.Errorf("trust bundle: document is %d bytes; at most %d", len(b.Document), MaxBundle)
	}
	if err := es256.Verify(pub, PurposeTrustBundle, b.Document, b.Signature); err != nil {
		return BundleDoc{}, fmt.Errorf("trust bundle: %w", err)
	}
	var d struct {
		Version             uint64          `json:"version"`
		CommandSigningRoots [][]byte        `json:"command_signing_roots"`
		Approvers           json.RawMessage `json:"approvers,omitempty"`
	}
	if err := strictjson.Decode(b.Document, &d); err != nil {
		return BundleDoc{}, fmt.Errorf("trust bundle document: %w", err)
	}
	if d.Version == 0 {
		return BundleDoc{}, errors.New("trust bundle document: no version")
	}
	roots, err := ParseRoots(d.CommandSigningRoots)
	if err != nil {
		return BundleDoc{}, fmt.Errorf("trust bundle document: %w", err)
	}
	return BundleDoc{Version: d.Version, Roots: roots}, nil
}

// MatchPin checks that spki is the key pin names.
func MatchPin(pin string, spki []byte) error {
	if !strings.HasPrefix(pin, es256.PinPrefix) {
		return fmt.Errorf("pin %q does not start with %s", pin, es256.PinPrefix)
	}
	if Pin(spki) != pin {
		return errors.New("signed by a key that is not join_signing_key_pin")
	}
	return nil
}

// JoinRecord is what bcd join, run as root, leaves in root's directory:
// the JoinResponse it verified (the JoinResult's protobuf bytes, their
// signature and the join-signing key) and the node id it names.
type JoinRecord struct {
	V          int    `json:"v"`
	NodeID     string `json:"node_id"`
	Result     []byte `json:"result"`
	Signature  []byte `json:"signature"`
	SigningKey []byte `json:"signing_key"`
}

// VerifyJoinRecord checks rec: its signing key is the one pin names, the
// signature over the result verifies, and the result names rec.NodeID
// (the JoinResult's first field, written first by every protobuf
// encoder: the tag 0x0a, the length, the id).
func VerifyJoinRecord(rec JoinRecord, pin string) error {
	if rec.V != 1 || rec.NodeID == "" || len(rec.NodeID) > 256 {
		return errors.New("join record: no version 1 or node id")
	}
	if err := MatchPin(pin, rec.SigningKey); err != nil {
		return fmt.Errorf("join record: %w", err)
	}
	pub, err := es256.ParseSPKI(rec.SigningKey)
	if err != nil {
		return fmt.Errorf("join record: signing key: %w", err)
	}
	if err := es256.Verify(pub, PurposeJoinResponse, rec.Result, rec.Signature); err != nil {
		return fmt.Errorf("join record: %w", err)
	}
	prefix := binary.AppendUvarint([]byte{0x0a}, uint64(len(rec.NodeID)))
	if !bytes.HasPrefix(rec.Result, append(prefix, rec.NodeID...)) {
		return fmt.Errorf("join record: the signed result is not for node %s", rec.NodeID)
	}
	return nil
}

// Signer is the root of b's document whose key id starts sig (nil when
// none does or the document does not read). It verifies nothing: the
// agent fills Proof.Signer with it, and root checks the key against its
// own pins.
func (b Bundle) Signer(sig []byte) []byte {
	if len(sig) != SignatureSize {
		return nil
	}
	var d struct {
		Roots [][]byte `json:"command_signing_roots"`
	}
	if json.Unmarshal(b.Document, &d) != nil {
		return nil
	}
	for _, k := range d.Roots {
		if id := KeyID(k); bytes.Equal(id[:], sig[:sha256.Size]) {
			return k
		}
	}
	return nil
}

// ErrOlderBundle refuses a trust bundle older than the one held.
var ErrOlderBundle = errors.New("trust bundle is older than the one held")

// Held is what a holder of a trust bundle knows of the one it holds, and
// of one offered: its version, its document's bytes and whether it names
// command-signing roots.
type Held struct {
	Version  uint64
	Document []byte
	HasRoots bool
}

// NextBundle says whether a holder of held takes next (a bundle already
// verified under the pin), the one rule the agent (components/trust/
// bundle) and root (components/helper/anchor) share: only a higher
// version; the held one again changes nothing; another document at the
// held version is refused; an older one is ErrOlderBundle; and once
// roots are held, a bundle naming none is refused, since whoever holds
// the join-signing key could otherwise switch signed intent off.
func NextBundle(held, next Held) (take bool, err error) {
	switch {
	case next.Version < held.Version:
		return false, fmt.Errorf("%w: version %d, holding %d", ErrOlderBundle, next.Version, held.Version)
	case next.Version == held.Version && bytes.Equal(next.Document, held.Document):
		return false, nil
	case next.Version == held.Version:
		return false, fmt.Errorf("trust bundle: another document at the held version %d", next.Version)
	case held.HasRoots && !next.HasRoots:
		return false, fmt.Errorf("trust bundle version %d names no command-signing roots, and the roots held are enforced: refused", next.Version)
	}
	return true, nil
}
