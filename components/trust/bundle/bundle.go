// Package bundle is the trust bundle: a versioned document, signed by the
// gateway's join-signing key (the key every agent pins at join), that
// names the command-signing roots (components/trust/intent) and, when
// set, the approver set of the destructive-batch quorum.
//
// The gateway sends it in every Welcome. An agent takes a bundle only when
// its signing key matches join_signing_key_pin and its signature verifies,
// and only a version higher than the one it holds: an older bundle, or a
// different one at the held version, is refused and the held one stays.
// The held bundle is stored in data_dir and verified again at every start.
// docs/signed-intent.md describes the document.
package bundle

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/quorum"
	"github.com/better-compute/bcd/components/trust/rootsig"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Purpose is the signature purpose of a trust bundle.
const Purpose = rootsig.PurposeTrustBundle

// File is the held bundle under data_dir.
const File = "trust-bundle.json"

// MaxDocument bounds a bundle document.
const MaxDocument = 64 << 10

// MaxApprovers bounds an approver set.
const MaxApprovers = 16

// Document is what a trust bundle says.
type Document struct {
	Version uint64 `json:"version"`
	// CommandSigningRoots are the SPKI DER of the keys whose signatures
	// make intent valid (ECDSA P-256). None: intent is not enforced.
	CommandSigningRoots [][]byte   `json:"command_signing_roots"`
	Approvers           *Approvers `json:"approvers,omitempty"`
}

// Approvers is the destructive-batch quorum: threshold of keys must sign
// a batch's root. A newer set is taken only at a higher epoch.
type Approvers struct {
	Epoch     uint64   `json:"epoch"`
	Threshold int      `json:"threshold"`
	Keys      [][]byte `json:"keys"`
	// Endorsements are signatures of this set by keys of the set before
	// it (at least its threshold), for an agent that holds that set.
	Endorsements [][]byte `json:"endorsements,omitempty"`
}

// Decode reads a bundle document strictly and checks it: a version, at
// most MaxRoots P-256 roots, and a sane approver set.
func Decode(b []byte) (Document, error) {
	var d Document
	if len(b) > MaxDocument {
		return d, fmt.Errorf("trust bundle document is %d bytes; at most %d", len(b), MaxDocument)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("trust bundle document: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return d, errors.New("trust bundle document: data after the JSON object")
	}
	if d.Version == 0 {
		return d, errors.New("trust bundle document: no version")
	}
	if _, err := intent.ParseRoots(d.CommandSigningRoots); err != nil {
		return d, fmt.Errorf("trust bundle document: %w", err)
	}
	if a := d.Approvers; a != nil {
		if len(a.Keys) == 0 || len(a.Keys) > MaxApprovers {
			return d, fmt.Errorf("trust bundle document: %d approver keys; 1 to %d", len(a.Keys), MaxApprovers)
		}
		if a.Threshold < 1 || a.Threshold > len(a.Keys) {
			return d, fmt.Errorf("trust bundle document: approver threshold %d of %d keys", a.Threshold, len(a.Keys))
		}
		if a.Epoch == 0 {
			return d, errors.New("trust bundle document: approver set without an epoch")
		}
		if _, err := intent.ParseRoots(a.Keys); err != nil {
			return d, fmt.Errorf("trust bundle document: approvers: %w", err)
		}
	}
	return d, nil
}

// Roots returns the document's command-signing roots.
func (d Document) Roots() *intent.Roots {
	r, _ := intent.ParseRoots(d.CommandSigningRoots) // Decode checked them
	return r
}

// Sign makes the TrustBundle frame of d, signed by the join-signing key.
func Sign(signer crypto.Signer, d Document) (*bcdv1.TrustBundle, error) {
	doc, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	if _, err := Decode(doc); err != nil {
		return nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, err
	}
	sig, err := pki.Sign(signer, Purpose, doc)
	if err != nil {
		return nil, err
	}
	return &bcdv1.TrustBundle{Version: d.Version, CommandSigningRoots: d.CommandSigningRoots, Document: doc, SigningKey: spki, Signature: sig}, nil
}

// Verify checks a TrustBundle frame against the join-signing key pin and
// returns its document.
func Verify(tb *bcdv1.TrustBundle, signingPin string) (Document, error) {
	pub, err := x509.ParsePKIXPublicKey(tb.GetSigningKey())
	if err != nil {
		return Document{}, fmt.Errorf("trust bundle: signing key: %w", err)
	}
	if err := pki.MatchPin(signingPin, pub); err != nil {
		return Document{}, fmt.Errorf("trust bundle: signed by a key that is not join_signing_key_pin")
	}
	if err := pki.Verify(pub, Purpose, tb.GetDocument(), tb.GetSignature()); err != nil {
		return Document{}, fmt.Errorf("trust bundle: %w", err)
	}
	return Decode(tb.GetDocument())
}

// stored is the held bundle on disk, with the approver set in force
// (which may be an older bundle's, when a newer set was refused).
type stored struct {
	Document   []byte     `json:"document"`
	SigningKey []byte     `json:"signing_key"`
	Signature  []byte     `json:"signature"`
	Approvers  *Approvers `json:"approvers,omitempty"`
}

// Held is an agent's trust bundle. Safe for concurrent use.
type Held struct {
	path string
	pin  string

	mu    sync.Mutex
	doc   Document
	raw   []byte // the held document's bytes
	key   []byte // the SPKI of the key that signed it
	sig   []byte // its signature
	roots *intent.Roots
	// approvers is the set in force; refused says why the last bundle's
	// set was not taken ("" when it was, or had none).
	approvers *Approvers
	refused   string
	// taken is a version taken since the last report asked (Taken).
	taken uint64
}

// Load reads the held bundle from dataDir (none: version 0, nothing
// enforced), verifying it again against pin. A stored bundle that no
// longer verifies is an error: the agent must not fall back to enforcing
// nothing.
func Load(dataDir, pin string) (*Held, error) {
	h := &Held{path: filepath.Join(dataDir, File), pin: pin}
	b, err := os.ReadFile(h.path)
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	var s stored
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("trust bundle %s: %w", h.path, err)
	}
	d, err := Verify(&bcdv1.TrustBundle{Document: s.Document, SigningKey: s.SigningKey, Signature: s.Signature}, pin)
	if err != nil {
		return nil, fmt.Errorf("trust bundle %s no longer verifies (join again, or restore it): %w", h.path, err)
	}
	h.doc, h.raw, h.roots, h.approvers = d, s.Document, d.Roots(), s.Approvers
	h.key, h.sig = s.SigningKey, s.Signature
	return h, nil
}

// nextApprovers is the approver set in force after a bundle naming next:
// the first set ever comes with a bundle the pinned key signed; a change
// needs a higher epoch and the held set's threshold of endorsements;
// anything else keeps the held set and says why.
func nextApprovers(held, next *Approvers) (*Approvers, string) {
	switch {
	case next == nil && held == nil:
		return nil, ""
	case next == nil:
		return held, "the bundle names no approver set; the held one stays (a set is only replaced, at a higher epoch)"
	case held == nil:
		return next, ""
	case next.Epoch == held.Epoch && next.Threshold == held.Threshold && equalKeys(next.Keys, held.Keys):
		return held, ""
	}
	hs, err := held.Set()
	if err == nil {
		err = quorum.Endorsed(hs, next.Epoch, next.Threshold, next.Keys, next.Endorsements)
	}
	if err != nil {
		return held, err.Error() + "; the held approver set stays"
	}
	return next, ""
}

func equalKeys(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// Set is a the approver set as quorum checks it.
func (a *Approvers) Set() (quorum.Set, error) {
	keys, err := intent.ParseRoots(a.Keys)
	if err != nil {
		return quorum.Set{}, err
	}
	return quorum.Set{Epoch: a.Epoch, Threshold: a.Threshold, Keys: keys}, nil
}

// ErrOlder refuses a bundle older than the held one.
var ErrOlder = rootsig.ErrOlderBundle

// Offer takes tb when it verifies and is newer than the held bundle,
// storing it (fsync) first. It reports whether it took it; nil tb, an
// empty one or the held one again change nothing.
func (h *Held) Offer(tb *bcdv1.TrustBundle) (bool, error) {
	if tb == nil || len(tb.GetDocument()) == 0 {
		return false, nil
	}
	d, err := Verify(tb, h.pin)
	if err != nil {
		return false, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	take, err := rootsig.NextBundle(rootsig.Held{Version: h.doc.Version, Document: h.raw, HasRoots: h.roots.Len() > 0},
		rootsig.Held{Version: d.Version, Document: tb.GetDocument(), HasRoots: len(d.CommandSigningRoots) > 0})
	if !take || err != nil {
		return false, err
	}
	approvers, refused := nextApprovers(h.approvers, d.Approvers)
	b, err := json.Marshal(stored{Document: tb.GetDocument(), SigningKey: tb.GetSigningKey(), Signature: tb.GetSignature(), Approvers: approvers})
	if err != nil {
		return false, err
	}
	if err := atomicfile.Write(h.path, b, 0o600); err != nil {
		return false, fmt.Errorf("storing the trust bundle: %w", err)
	}
	h.doc, h.raw, h.roots, h.taken = d, append([]byte(nil), tb.GetDocument()...), d.Roots(), d.Version
	h.key, h.sig = bytes.Clone(tb.GetSigningKey()), bytes.Clone(tb.GetSignature())
	h.approvers, h.refused = approvers, refused
	return true, nil
}

// Approvers is the approver set in force (nil: no quorum).
func (h *Held) Approvers() *Approvers {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.approvers
}

// ApproversRefused says why the last bundle's approver set was not taken
// ("" when it was).
func (h *Held) ApproversRefused() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refused
}

// Version is the held bundle's version (0: none).
func (h *Held) Version() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.doc.Version
}

// Document is the held bundle's document.
func (h *Held) Document() Document {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.doc
}

// Roots are the held command-signing roots (none: not enforced).
func (h *Held) Roots() *intent.Roots {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.roots
}

// Signed is the held bundle as signed, for bcd helper to verify on its
// own under root's pin (nil: none held).
func (h *Held) Signed() *rootsig.Bundle {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.raw) == 0 {
		return nil
	}
	return &rootsig.Bundle{Document: bytes.Clone(h.raw), SigningKey: bytes.Clone(h.key), Signature: bytes.Clone(h.sig)}
}

// Enforced reports whether signed intent is enforced.
func (h *Held) Enforced() bool { return h.Roots().Len() > 0 }

// Taken returns the version taken since it was last called (0: none), so
// the next StatusReport acknowledges a newer bundle once.
func (h *Held) Taken() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	v := h.taken
	h.taken = 0
	return v
}
