package adminapi

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"slices"

	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
)

// ApproverSet is an approver set as bcgw trust approvers propose prints
// it, endorse adds endorsements to and set puts into the trust bundle.
type ApproverSet struct {
	Epoch     uint64 `json:"epoch"`
	Threshold int    `json:"threshold"`
	// Keys are the approvers' public keys, SPKI DER (base64 in JSON) of
	// ECDSA P-256 keys; endorsements cover them in this order.
	Keys [][]byte `json:"keys"`
	// Endorsements are quorum.Endorse signatures of the set (key id and
	// ES256 signature each) by keys of the set it replaces.
	Endorsements [][]byte `json:"endorsements"`
}

// MaxApproverSetFile bounds an approver set file (the bundle document
// holding it is at most 64 KiB).
const MaxApproverSetFile = bundle.MaxDocument

// MaxEndorsements bounds the endorsements a set carries: those of the set
// it replaces, and of earlier sets for agents that missed a change.
const MaxEndorsements = 2 * bundle.MaxApprovers

// Check checks every field: an epoch, 1 to 16 distinct P-256 keys in
// their canonical encoding, a threshold they can meet, endorsements of
// the size of a signature.
func (a ApproverSet) Check() error {
	if a.Epoch == 0 {
		return errors.New("epoch is missing (at least 1)")
	}
	if len(a.Keys) == 0 || len(a.Keys) > bundle.MaxApprovers {
		return fmt.Errorf("%d keys; an approver set has 1 to %d", len(a.Keys), bundle.MaxApprovers)
	}
	for i, k := range a.Keys {
		der, err := CanonicalKey(k, "an approver key")
		if err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		if !bytes.Equal(der, k) {
			return fmt.Errorf("key %d is not in the canonical SPKI DER encoding (take it from its PEM with bcgw trust approvers propose)", i)
		}
		if slices.ContainsFunc(a.Keys[:i], func(o []byte) bool { return bytes.Equal(o, k) }) {
			return fmt.Errorf("key %d (%s) is named twice", i, PinOfSPKI(k))
		}
	}
	if a.Threshold < 1 || a.Threshold > len(a.Keys) {
		return fmt.Errorf("threshold %d of %d keys; it must be 1 to %d", a.Threshold, len(a.Keys), len(a.Keys))
	}
	if len(a.Endorsements) > MaxEndorsements {
		return fmt.Errorf("%d endorsements; at most %d", len(a.Endorsements), MaxEndorsements)
	}
	for i, e := range a.Endorsements {
		if len(e) != intent.SignatureSize {
			return fmt.Errorf("endorsement %d is %d bytes; an endorsement is %d (the endorser's key id and an ES256 signature)", i, len(e), intent.SignatureSize)
		}
	}
	return nil
}

// normalized has non-nil lists, so JSON shows [] rather than null.
func (a ApproverSet) normalized() ApproverSet {
	if a.Endorsements == nil {
		a.Endorsements = [][]byte{}
	}
	if a.Keys == nil {
		a.Keys = [][]byte{}
	}
	return a
}

// DecodeApproverSet reads an approver set file strictly and checks it.
func DecodeApproverSet(b []byte) (ApproverSet, error) {
	var a ApproverSet
	if len(b) > MaxApproverSetFile {
		return a, fmt.Errorf("the approver set file is %d bytes; at most %d", len(b), MaxApproverSetFile)
	}
	if err := StrictDecode(b, &a); err != nil {
		return a, fmt.Errorf("not an approver set (bcgw trust approvers propose makes one): %w", err)
	}
	if err := a.Check(); err != nil {
		return a, fmt.Errorf("approver set: %w", err)
	}
	return a.normalized(), nil
}

// ParseApproverKeyPEM reads an approver's public key: one PEM "PUBLIC
// KEY" block holding an ECDSA P-256 key. It returns its SPKI DER as Go
// encodes it (the form the bundle carries and the key id is taken of).
func ParseApproverKeyPEM(b []byte) ([]byte, error) { return parsePublicKeyPEM(b, "an approver key") }

// ProposeApprovers makes a new approver set of keys (SPKI DER of P-256
// keys) and threshold, with no endorsements, at epoch: 0 means the held
// epoch plus one. An epoch not above the held one is refused: agents that
// hold that set would keep it.
func ProposeApprovers(heldEpoch, epoch uint64, threshold int, keys [][]byte) (ApproverSet, error) {
	if epoch == 0 {
		epoch = heldEpoch + 1
	}
	if epoch <= heldEpoch {
		return ApproverSet{}, fmt.Errorf("epoch %d is not above the held approver set's epoch %d: agents that hold that set would keep it", epoch, heldEpoch)
	}
	canon := make([][]byte, len(keys))
	for i, k := range keys {
		der, err := CanonicalKey(k, "an approver key")
		if err != nil {
			return ApproverSet{}, fmt.Errorf("key %d: %w", i, err)
		}
		canon[i] = der
	}
	a := ApproverSet{Epoch: epoch, Threshold: threshold, Keys: canon}
	if err := a.Check(); err != nil {
		return ApproverSet{}, err
	}
	return a.normalized(), nil
}

// EndorseApprovers adds key's endorsement (quorum.Endorse) to the
// approver set file b and returns the set, and a line saying what was
// endorsed. An endorsement by the same key already there is replaced.
func EndorseApprovers(key crypto.Signer, b []byte) (ApproverSet, string, error) {
	a, err := DecodeApproverSet(b)
	if err != nil {
		return a, "", err
	}
	e, err := quorum.Endorse(key, a.Epoch, a.Threshold, a.Keys)
	if err != nil {
		return a, "", err
	}
	id, _, _ := intent.ParseSignature(e)
	kept := a.Endorsements[:0:0]
	replaced := false
	for _, o := range a.Endorsements {
		if oid, _, _ := intent.ParseSignature(o); oid == id {
			replaced = true
			continue
		}
		kept = append(kept, o)
	}
	a.Endorsements = append(kept, e)
	if len(a.Endorsements) > MaxEndorsements {
		return a, "", fmt.Errorf("the set carries %d endorsements already, the most it may", MaxEndorsements)
	}
	what := fmt.Sprintf("approver set epoch %d (threshold %d of %d keys); it carries %d endorsements", a.Epoch, a.Threshold, len(a.Keys), len(a.Endorsements))
	if replaced {
		what += " (this key's earlier endorsement replaced)"
	}
	return a, what, nil
}

// ApproversView is the trust bundle's approver set as the trust view
// shows it.
type ApproversView struct {
	Epoch     uint64 `json:"epoch"`
	Threshold int    `json:"threshold"`
	// Keys are the approvers' key pins (sha256/…).
	Keys         []string `json:"keys"`
	Endorsements int      `json:"endorsements"`
}

// ApproversChange answers bcgw trust approvers set.
type ApproversChange struct {
	// Version is the trust bundle's version afterwards; Changed is false
	// when the bundle held this very set (endorsements included).
	Version      uint64 `json:"version"`
	Changed      bool   `json:"changed"`
	Epoch        uint64 `json:"epoch"`
	Threshold    int    `json:"threshold"`
	Keys         int    `json:"keys"`
	Endorsements int    `json:"endorsements"`
	// Warning says why agents that hold the bundle's earlier set will
	// keep it (the set is not endorsed enough, or its epoch is not
	// higher).
	Warning string `json:"warning,omitempty"`
}
