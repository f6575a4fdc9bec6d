// Package release is bcd's signed release manifest: which binary, of which
// version, for which role and architecture, with its size and SHA-256 and
// where to fetch it, signed offline by k of n release keys. A node takes a
// release only from a manifest that verifies under its own pins
// ([update] release_pins, release_threshold), has not expired, and whose
// sequence is not below the release floor it holds (the sequence of the
// last release it confirmed). Every refusal is final: the same manifest
// never verifies later. docs/update.md gives the format and the threat
// model beside TUF's.
package release

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/strictjson"
	"github.com/better-compute/bcd/components/trust/pki/es256"
)

// Type is the manifest's type and the signatures' purpose.
const Type = "bcd/release/v1"

// Bounds of a manifest document.
const (
	MaxDocument  = 64 << 10
	MaxArtifacts = 64
	MaxSigs      = 16
)

// Manifest is one release.
type Manifest struct {
	Type      string     `json:"type"`
	Version   string     `json:"version"`
	Sequence  uint64     `json:"sequence"`
	Expires   time.Time  `json:"expires"`
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one binary of the release.
type Artifact struct {
	Role   string `json:"role"` // node, site, ramdisk, helper
	Arch   string `json:"arch"` // amd64, arm64
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}

// Document is a signed manifest as it travels: the manifest's exact
// bytes and the signatures over them.
type Document struct {
	Payload    []byte      `json:"payload"` // the manifest's JSON (base64 in JSON)
	Signatures []Signature `json:"signatures"`
}

// Signature is one release key's signature: its public key (DER SPKI,
// whose pin must be one the node holds) and an ES256 signature over the
// payload for purpose Type.
type Signature struct {
	Key []byte `json:"key"`
	Sig []byte `json:"sig"`
}

// FinalError is a refusal that no retry changes: the manifest is bad,
// expired, under-signed or older than the floor.
type FinalError struct{ Err error }

func (e *FinalError) Error() string { return "release manifest refused: " + e.Err.Error() }
func (e *FinalError) Unwrap() error { return e.Err }

func final(format string, a ...any) error { return &FinalError{Err: fmt.Errorf(format, a...)} }

var (
	roles  = []string{"node", "site", "ramdisk", "helper"}
	arches = []string{"amd64", "arm64"}
)

// Check checks a manifest's own fields.
func (m Manifest) Check() error {
	switch {
	case m.Type != Type:
		return fmt.Errorf("type %q, want %s", clip(m.Type), Type)
	case !isVersion(m.Version):
		return fmt.Errorf("version %q is not MAJOR.MINOR.PATCH[-pre]", clip(m.Version))
	case m.Sequence == 0:
		return errors.New("sequence 0: sequences start at 1")
	case m.Expires.IsZero():
		return errors.New("no expiry")
	case len(m.Artifacts) == 0 || len(m.Artifacts) > MaxArtifacts:
		return fmt.Errorf("%d artifacts: 1 to %d", len(m.Artifacts), MaxArtifacts)
	}
	seen := map[string]bool{}
	for i, a := range m.Artifacts {
		key := a.Role + "/" + a.Arch
		switch {
		case !slices.Contains(roles, a.Role):
			return fmt.Errorf("artifacts[%d]: role %q is not one of %s", i, clip(a.Role), strings.Join(roles, ", "))
		case !slices.Contains(arches, a.Arch):
			return fmt.Errorf("artifacts[%d]: arch %q is not one of %s", i, clip(a.Arch), strings.Join(arches, ", "))
		case seen[key]:
			return fmt.Errorf("artifacts[%d]: %s is listed twice", i, key)
		case a.Size <= 0 || a.Size > 1<<30:
			return fmt.Errorf("artifacts[%d]: size %d: 1 byte to 1 GiB", i, a.Size)
		case !hexDigest(a.SHA256):
			return fmt.Errorf("artifacts[%d]: sha256 is not 64 lower-case hex digits", i)
		case !strings.HasPrefix(a.URL, "https://") && !strings.HasPrefix(a.URL, "http://") || len(a.URL) > 2048 || strings.ContainsAny(a.URL, " \n\r\t"):
			return fmt.Errorf("artifacts[%d]: url is not an http(s) URL", i)
		}
		seen[key] = true
	}
	return nil
}

func hexDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Artifact returns the manifest's binary for role and arch.
func (m Manifest) Artifact(role, arch string) (Artifact, error) {
	for _, a := range m.Artifacts {
		if a.Role == role && a.Arch == arch {
			return a, nil
		}
	}
	return Artifact{}, final("release %s has no %s binary for %s", m.Version, role, arch)
}

// Encode makes a document of m with no signature yet.
func Encode(m Manifest) ([]byte, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	payload, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return json.MarshalIndent(Document{Payload: payload, Signatures: []Signature{}}, "", "  ")
}

// Decode reads a document strictly (not its signatures' validity).
func Decode(b []byte) (Document, Manifest, error) {
	var d Document
	var m Manifest
	if len(b) > MaxDocument {
		return d, m, final("%d bytes; at most %d", len(b), MaxDocument)
	}
	if err := strict(b, &d); err != nil {
		return d, m, final("%v", err)
	}
	if len(d.Signatures) > MaxSigs {
		return d, m, final("%d signatures; at most %d", len(d.Signatures), MaxSigs)
	}
	if err := strict(d.Payload, &m); err != nil {
		return d, m, final("payload: %v", err)
	}
	if err := m.Check(); err != nil {
		return d, m, final("%v", err)
	}
	return d, m, nil
}

func strict(b []byte, v any) error { return strictjson.Decode(b, v) }

// Sign adds k's signature to a document.
func Sign(doc []byte, k crypto.Signer) ([]byte, error) {
	d, _, err := Decode(doc)
	if err != nil {
		return nil, err
	}
	spki, err := es256.MarshalSPKI(k.Public())
	if err != nil {
		return nil, err
	}
	for _, s := range d.Signatures {
		if bytes.Equal(s.Key, spki) {
			return nil, errors.New("the document already carries this key's signature")
		}
	}
	sig, err := es256.Sign(k, Type, d.Payload)
	if err != nil {
		return nil, err
	}
	d.Signatures = append(d.Signatures, Signature{Key: spki, Sig: sig})
	return json.MarshalIndent(d, "", "  ")
}

// Policy is what a node holds: its pinned release keys, how many must
// sign, and the floor (the sequence of the last release it confirmed).
type Policy struct {
	Pins      []string
	Threshold int
	Floor     uint64
}

// Verify checks a document under p at now and returns its manifest.
// Every error is a *FinalError.
func Verify(doc []byte, p Policy, now time.Time) (Manifest, error) {
	if len(p.Pins) == 0 || p.Threshold < 1 || p.Threshold > len(p.Pins) {
		return Manifest{}, final("no release keys pinned, or a threshold of %d for %d pins: self-update is off ([update] release_pins, release_threshold)", p.Threshold, len(p.Pins))
	}
	d, m, err := Decode(doc)
	if err != nil {
		return m, err
	}
	valid := map[string]bool{}
	for _, s := range d.Signatures {
		pub, err := es256.ParseSPKI(s.Key)
		if err != nil {
			continue
		}
		sum := sha256.Sum256(s.Key)
		pin := es256.PinPrefix + base64.StdEncoding.EncodeToString(sum[:])
		if !slices.Contains(p.Pins, pin) || valid[pin] {
			continue
		}
		if es256.Verify(pub, Type, d.Payload, s.Sig) == nil {
			valid[pin] = true
		}
	}
	switch {
	case len(valid) < p.Threshold:
		return m, final("release %s is signed by %d of the pinned keys; %d must sign", m.Version, len(valid), p.Threshold)
	case !now.Before(m.Expires):
		return m, final("release %s expired at %s", m.Version, m.Expires.UTC().Format(time.RFC3339))
	case m.Sequence < p.Floor:
		return m, final("release %s has sequence %d, below the release floor %d (a release this node confirmed): nothing takes a node back", m.Version, m.Sequence, p.Floor)
	}
	return m, nil
}

// isVersion reports whether v is MAJOR.MINOR.PATCH, each digits, then
// optionally - or + and 1 to 64 of [0-9A-Za-z.-] (without regexp, which
// bcd helper would otherwise link for this alone).
func isVersion(v string) bool {
	for i := range 3 {
		n := 0
		for n < len(v) && v[n] >= '0' && v[n] <= '9' {
			n++
		}
		if n == 0 {
			return false
		}
		v = v[n:]
		if i < 2 {
			if v == "" || v[0] != '.' {
				return false
			}
			v = v[1:]
		}
	}
	if v == "" {
		return true
	}
	if v[0] != '-' && v[0] != '+' || len(v) < 2 || len(v) > 65 {
		return false
	}
	for _, c := range []byte(v[1:]) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// UpgradeKind is the command that upgrades a node or site agent to a
// release: the agent runs it (components/agent/update), the gateway keeps
// each node's latest one, and bcgw upgrade sends it.
const UpgradeKind = "daemon.upgrade"

// UpgradeBody is UpgradeKind's body: the signed release document itself,
// or an http(s) URL to fetch it from.
type UpgradeBody struct {
	Release    json.RawMessage `json:"release,omitempty"`
	ReleaseURL string          `json:"release_url,omitempty"`
}
