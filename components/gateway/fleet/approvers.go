package fleet

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/quorum"
)

func viewApprovers(a *bundle.Approvers) *adminapi.ApproversView {
	if a == nil {
		return nil
	}
	v := &adminapi.ApproversView{Epoch: a.Epoch, Threshold: a.Threshold, Keys: []string{}, Endorsements: len(a.Endorsements)}
	for _, k := range a.Keys {
		v.Keys = append(v.Keys, adminapi.PinOfSPKI(k))
	}
	return v
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
func (s *Fleet) SetApprovers(a adminapi.ApproverSet) (adminapi.ApproversChange, error) {
	if err := a.Check(); err != nil {
		return adminapi.ApproversChange{}, fmt.Errorf("approver set: %w", err)
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
		return adminapi.ApproversChange{}, err
	}
	if warning != "" {
		s.log.Warn("approver set stored that agents holding the earlier one refuse", "epoch", a.Epoch, "warning", warning)
	}
	return adminapi.ApproversChange{Version: doc.Version, Changed: changed, Epoch: a.Epoch, Threshold: a.Threshold, Keys: len(a.Keys),
		Endorsements: len(a.Endorsements), Warning: warning}, nil
}
