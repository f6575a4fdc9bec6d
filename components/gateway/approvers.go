package gateway

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/quorum"
)

// The approver set of the destructive-batch quorum (components/trust/quorum)
// lives in the trust bundle. A new set is proposed (bcgw trust approvers
// propose, from the held epoch), endorsed where the approvers' keys are
// (bcgw trust approvers endorse, no gateway needed) and put into the bundle
// (bcgw trust approvers set). Agents take the first set as the bundle says,
// and a later one only at a higher epoch endorsed by at least the held
// set's threshold of its keys; bcgw stores what it is given and warns when
// agents will keep the old set.

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

// maxApproverSetFile bounds an approver set file (the bundle document
// holding it is at most 64 KiB).
const maxApproverSetFile = bundle.MaxDocument

// MaxEndorsements bounds the endorsements a set carries: those of the set
// it replaces, and of earlier sets for agents that missed a change.
const MaxEndorsements = 2 * bundle.MaxApprovers

// check checks every field: an epoch, 1 to 16 distinct P-256 keys in
// their canonical encoding, a threshold they can meet, endorsements of
// the size of a signature.
func (a ApproverSet) check() error {
	if a.Epoch == 0 {
		return errors.New("epoch is missing (at least 1)")
	}
	if len(a.Keys) == 0 || len(a.Keys) > bundle.MaxApprovers {
		return fmt.Errorf("%d keys; an approver set has 1 to %d", len(a.Keys), bundle.MaxApprovers)
	}
	for i, k := range a.Keys {
		der, err := canonicalKey(k, "an approver key")
		if err != nil {
			return fmt.Errorf("key %d: %w", i, err)
		}
		if !bytes.Equal(der, k) {
			return fmt.Errorf("key %d is not in the canonical SPKI DER encoding (take it from its PEM with bcgw trust approvers propose)", i)
		}
		if slices.ContainsFunc(a.Keys[:i], func(o []byte) bool { return bytes.Equal(o, k) }) {
			return fmt.Errorf("key %d (%s) is named twice", i, pinOfSPKI(k))
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
	if len(b) > maxApproverSetFile {
		return a, fmt.Errorf("the approver set file is %d bytes; at most %d", len(b), maxApproverSetFile)
	}
	if err := strictDecode(b, &a); err != nil {
		return a, fmt.Errorf("not an approver set (bcgw trust approvers propose makes one): %w", err)
	}
	if err := a.check(); err != nil {
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
		der, err := canonicalKey(k, "an approver key")
		if err != nil {
			return ApproverSet{}, fmt.Errorf("key %d: %w", i, err)
		}
		canon[i] = der
	}
	a := ApproverSet{Epoch: epoch, Threshold: threshold, Keys: canon}
	if err := a.check(); err != nil {
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

func viewApprovers(a *bundle.Approvers) *ApproversView {
	if a == nil {
		return nil
	}
	v := &ApproversView{Epoch: a.Epoch, Threshold: a.Threshold, Keys: []string{}, Endorsements: len(a.Endorsements)}
	for _, k := range a.Keys {
		v.Keys = append(v.Keys, pinOfSPKI(k))
	}
	return v
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

func sameKeys(a, b [][]byte) bool {
	return slices.EqualFunc(a, b, func(x, y []byte) bool { return bytes.Equal(x, y) })
}

// SetApprovers puts an approver set into the trust bundle: a new version,
// and every live session drained, as a root change. bcgw does not decide
// whether the set may replace the held one (agents do), but the warning
// says when the set replaces a held set without at least its threshold
// of valid endorsements by its keys at a higher epoch (quorum.Endorsed):
// agents that hold the earlier set keep it. A set the bundle already
// holds, endorsements included, changes nothing.
func (s *Server) SetApprovers(a ApproverSet) (ApproversChange, error) {
	if err := a.check(); err != nil {
		return ApproversChange{}, fmt.Errorf("approver set: %w", err)
	}
	next := &bundle.Approvers{Epoch: a.Epoch, Threshold: a.Threshold, Keys: a.Keys, Endorsements: a.Endorsements}
	if len(next.Endorsements) == 0 {
		next.Endorsements = nil
	}
	warning := ""
	doc, changed, err := s.commitTrust(func(doc *bundle.Document) (bool, error) {
		held := doc.Approvers
		if held != nil && held.Epoch == next.Epoch && held.Threshold == next.Threshold && sameKeys(held.Keys, next.Keys) &&
			sameKeys(held.Endorsements, next.Endorsements) {
			return false, nil
		}
		if held != nil && !(held.Epoch == next.Epoch && held.Threshold == next.Threshold && sameKeys(held.Keys, next.Keys)) {
			hs, err := held.Set()
			if err == nil {
				err = quorum.Endorsed(hs, next.Epoch, next.Threshold, next.Keys, next.Endorsements)
			}
			if err != nil {
				warning = fmt.Sprintf("agents that hold the approver set of epoch %d keep it: %v", held.Epoch, err)
			}
		}
		doc.Approvers = next
		return true, nil
	})
	if err != nil {
		return ApproversChange{}, err
	}
	if warning != "" {
		s.log.Warn("approver set stored that agents holding the earlier one refuse", "epoch", a.Epoch, "warning", warning)
	}
	return ApproversChange{Version: doc.Version, Changed: changed, Epoch: a.Epoch, Threshold: a.Threshold, Keys: len(a.Keys),
		Endorsements: len(a.Endorsements), Warning: warning}, nil
}

// ---- admin API ----

func (s *Server) adminSetApprovers(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxApproverSetFile+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	a, err := DecodeApproverSet(b)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	ch, err := s.SetApprovers(a)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, ch)
}
