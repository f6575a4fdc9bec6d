// Package intent signs and verifies what a gateway asks of an agent: each
// Command and each DesiredState carries a signature by a command-signing
// key, and once the agent's trust bundle names command-signing roots it
// refuses intent that is unsigned (ErrUnsigned) or whose signature does
// not verify under one of them (ErrBadSignature). docs/signed-intent.md
// describes the rules.
//
// A signature covers a fixed message built from the frame's fields, never
// a re-encoding of the frame: for a command its id, node id, kind, lane,
// workflow id, deadline and the SHA-256 of its body; for a desired state
// the node it is for (the agent's own id), its generation, whether it is a
// patch, the generation a patch applies on, the SHA-256 of the spec bytes
// and the SHA-256 of each section of the full spec it makes
// (components/trust/rootsig, which the root half verifies with). A signature for one node, or one command, never verifies for
// another, and a signed command cannot be given a later deadline.
//
// The signature field holds the SHA-256 of the signer's SPKI (which root
// signed) followed by the 64-byte ES256 signature of pki.Sign.
package intent

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/rootsig"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Signature purposes.
const (
	PurposeCommand      = "bcd/command/v1"
	PurposeDesiredState = rootsig.PurposeDesiredState
)

// SignatureSize is the length of a signature field: key id and signature.
const SignatureSize = sha256.Size + pki.SignatureSize

// MaxRoots bounds the command-signing roots a bundle may name.
const MaxRoots = 16

// MaxDeadline is how far ahead a signed command's deadline may be when it
// is made (bcgw run --deadline). An agent keeps every command id it ran
// until the command's deadline has passed, so a signed command cannot be
// replayed; the cap bounds how long that is (docs/signed-intent.md).
// Agents refuse a signed command without a deadline, or with one more
// than MaxDeadline and DeadlineSkew ahead of their clock.
const MaxDeadline = 7 * 24 * time.Hour

// DeadlineSkew is the agent's allowance, on top of MaxDeadline, for a
// gateway clock ahead of its own.
const DeadlineSkew = time.Hour

// Refusals, as the dispatcher reports them (Status) and the engine shows
// them.
var (
	ErrUnsigned     = errors.New("UNSIGNED")
	ErrBadSignature = errors.New("BAD_SIGNATURE")
)

// commandMessage is what a command signature covers; JSON of a struct is
// deterministic (fields in declaration order).
type commandMessage struct {
	V          int    `json:"v"`
	ID         string `json:"id"`
	NodeID     string `json:"node_id"`
	Kind       string `json:"kind"`
	Lane       string `json:"lane"`
	WorkflowID string `json:"workflow_id"`
	DeadlineMS int64  `json:"deadline_unix_ms"`
	BodySHA256 []byte `json:"body_sha256"`
}

// CommandMessage returns the bytes a command's signature covers.
func CommandMessage(c *bcdv1.Command) []byte {
	sum := sha256.Sum256(c.GetBody())
	b, _ := json.Marshal(commandMessage{V: 1, ID: c.GetId(), NodeID: c.GetNodeId(), Kind: c.GetKind(), Lane: c.GetLane(),
		WorkflowID: c.GetWorkflowId(), DeadlineMS: c.GetDeadlineUnixMs(), BodySHA256: sum[:]})
	return b
}

// DesiredStateMessage returns the bytes a DesiredState's signature covers
// when it is for nodeID and makes the full spec full (the frame's own
// spec, or the held spec with the frame's patch merged): the frame's
// fields and the SHA-256 of each of full's sections, so that the root half
// can check one section on its own (components/trust/rootsig).
func DesiredStateMessage(nodeID string, ds *bcdv1.DesiredState, full nodespec.Spec) ([]byte, error) {
	p, err := DesiredStateProof(nodeID, ds, full)
	if err != nil {
		return nil, err
	}
	return p.Message(), nil
}

// DesiredStateProof is what the agent shows bcd helper of ds: its signed
// fields, the digests of full's sections and its signature (no bundle).
func DesiredStateProof(nodeID string, ds *bcdv1.DesiredState, full nodespec.Spec) (rootsig.Proof, error) {
	sum := sha256.Sum256(ds.GetSpec())
	d, err := rootsig.SectionDigests(full)
	if err != nil {
		return rootsig.Proof{}, fmt.Errorf("desired state: %w", err)
	}
	return rootsig.Proof{NodeID: nodeID, Generation: ds.GetGeneration(), Patch: ds.GetPatch(), BaseGeneration: ds.GetBaseGeneration(),
		SpecSHA256: sum[:], Sections: d, Signature: ds.GetSignature()}, nil
}

// PurposeCancel is the purpose of a Cancel's signature.
const PurposeCancel = "bcd/cancel/v1"

// CancelMessage returns the bytes a Cancel's signature covers when it is
// for nodeID.
func CancelMessage(nodeID string, c *bcdv1.Cancel) []byte {
	b, _ := json.Marshal(struct {
		V         int    `json:"v"`
		NodeID    string `json:"node_id"`
		CommandID string `json:"command_id"`
		Reason    string `json:"reason"`
	}{1, nodeID, c.GetCommandId(), c.GetReason()})
	return b
}

// SignCancel returns the signature field for c, for nodeID, by k.
func SignCancel(k crypto.Signer, nodeID string, c *bcdv1.Cancel) ([]byte, error) {
	return Sign(k, PurposeCancel, CancelMessage(nodeID, c))
}

// VerifyCancel checks c's signature for nodeID; with no roots every
// Cancel passes.
func (r *Roots) VerifyCancel(nodeID string, c *bcdv1.Cancel) error {
	if r.Len() == 0 {
		return nil
	}
	return r.verify(PurposeCancel, CancelMessage(nodeID, c), c.GetSignature())
}

// PurposeResult is the purpose of a node's attestation of a result.
const PurposeResult = "bcd/result/v1"

type resultMessage struct {
	V            int    `json:"v"`
	CommandID    string `json:"command_id"`
	NodeID       string `json:"node_id"`
	Kind         string `json:"kind"`
	Status       string `json:"status"`
	OutputSHA256 []byte `json:"output_sha256"`
	StartedMS    int64  `json:"started_unix_ms"`
	FinishedMS   int64  `json:"finished_unix_ms"`
}

// ResultMessage returns the bytes a node's attestation of r covers.
func ResultMessage(nodeID, kind string, r *bcdv1.CommandResult) []byte {
	sum := sha256.Sum256(r.GetOutput())
	b, _ := json.Marshal(resultMessage{V: 1, CommandID: r.GetCommandId(), NodeID: nodeID, Kind: kind, Status: r.GetStatus(),
		OutputSHA256: sum[:], StartedMS: r.GetStartedUnixMs(), FinishedMS: r.GetFinishedUnixMs()})
	return b
}

// AttestResult signs r with the node key (an ES256 signature).
func AttestResult(nodeKey crypto.Signer, nodeID, kind string, r *bcdv1.CommandResult) ([]byte, error) {
	return pki.Sign(nodeKey, PurposeResult, ResultMessage(nodeID, kind, r))
}

// VerifyResult checks r's attestation by the node key pub.
func VerifyResult(pub crypto.PublicKey, nodeID, kind string, r *bcdv1.CommandResult) error {
	return pki.Verify(pub, PurposeResult, ResultMessage(nodeID, kind, r), r.GetAttestation())
}

// KeyID is the SHA-256 of a public key's SPKI DER.
func KeyID(pub crypto.PublicKey) ([32]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return [32]byte{}, fmt.Errorf("key id: %w", err)
	}
	return sha256.Sum256(der), nil
}

// Sign returns a signature field for purpose over msg by k: the SHA-256
// of k's SPKI followed by pki.Sign's ES256 signature. Command, desired
// state and cancel signatures, batch approvals and approver-set
// endorsements are all of this form.
func Sign(k crypto.Signer, purpose string, msg []byte) ([]byte, error) {
	id, err := KeyID(k.Public())
	if err != nil {
		return nil, err
	}
	sig, err := pki.Sign(k, purpose, msg)
	if err != nil {
		return nil, err
	}
	return append(id[:], sig...), nil
}

// SignCommand returns the signature field for c by k.
func SignCommand(k crypto.Signer, c *bcdv1.Command) ([]byte, error) {
	return Sign(k, PurposeCommand, CommandMessage(c))
}

// SignDesiredState returns the signature field for ds, for nodeID, by k.
func SignDesiredState(k crypto.Signer, nodeID string, ds *bcdv1.DesiredState, full nodespec.Spec) ([]byte, error) {
	msg, err := DesiredStateMessage(nodeID, ds, full)
	if err != nil {
		return nil, err
	}
	return Sign(k, PurposeDesiredState, msg)
}

// ParseSignature splits a signature field into the signer's key id and
// its signature.
func ParseSignature(b []byte) (keyID [32]byte, sig []byte, err error) {
	if len(b) != SignatureSize {
		return keyID, nil, fmt.Errorf("signature field is %d bytes, want %d (key id and ES256 signature)", len(b), SignatureSize)
	}
	copy(keyID[:], b[:sha256.Size])
	return keyID, b[sha256.Size:], nil
}

// Roots are the command-signing roots of a trust bundle.
type Roots struct {
	keys map[[32]byte]*ecdsa.PublicKey
}

// ParseRoots reads roots from SPKI DER; each must be an ECDSA P-256 key.
func ParseRoots(spkis [][]byte) (*Roots, error) {
	if len(spkis) > MaxRoots {
		return nil, fmt.Errorf("%d command-signing roots; at most %d", len(spkis), MaxRoots)
	}
	r := &Roots{keys: map[[32]byte]*ecdsa.PublicKey{}}
	for i, der := range spkis {
		pub, err := x509.ParsePKIXPublicKey(der)
		if err != nil {
			return nil, fmt.Errorf("command-signing root %d: %w", i, err)
		}
		ep, ok := pub.(*ecdsa.PublicKey)
		if !ok || ep.Curve.Params().Name != "P-256" {
			return nil, fmt.Errorf("command-signing root %d is not an ECDSA P-256 key", i)
		}
		r.keys[sha256.Sum256(der)] = ep
	}
	return r, nil
}

// Len is how many roots there are; with none, intent is not enforced.
func (r *Roots) Len() int {
	if r == nil {
		return 0
	}
	return len(r.keys)
}

func (r *Roots) verify(purpose string, msg, field []byte) error {
	if len(field) == 0 {
		return fmt.Errorf("%w: no signature, and this agent's trust bundle names command-signing roots", ErrUnsigned)
	}
	id, sig, err := ParseSignature(field)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	pub := r.keys[id]
	if pub == nil {
		return fmt.Errorf("%w: signed by a key that is not a command-signing root of the trust bundle", ErrBadSignature)
	}
	if err := pki.Verify(pub, purpose, msg, sig); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return nil
}

// Verify checks sig, for purpose over msg, by the key with id; an id that
// is not one of the keys is an error.
func (r *Roots) Verify(id [32]byte, purpose string, msg, sig []byte) error {
	if r == nil || r.keys[id] == nil {
		return errors.New("not one of the keys")
	}
	return pki.Verify(r.keys[id], purpose, msg, sig)
}

// VerifyCommand checks c's signature; with no roots every command passes.
func (r *Roots) VerifyCommand(c *bcdv1.Command) error {
	if r.Len() == 0 {
		return nil
	}
	return r.verify(PurposeCommand, CommandMessage(c), c.GetSignature())
}

// VerifyDesiredState checks ds's signature for nodeID, ds making the
// full spec full; with no roots every DesiredState passes.
func (r *Roots) VerifyDesiredState(nodeID string, ds *bcdv1.DesiredState, full nodespec.Spec) error {
	if r.Len() == 0 {
		return nil
	}
	msg, err := DesiredStateMessage(nodeID, ds, full)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return r.verify(PurposeDesiredState, msg, ds.GetSignature())
}
