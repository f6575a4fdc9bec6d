package admin

import (
	"fmt"
	"io"
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// The approver set of the destructive-batch quorum (components/trust/quorum)
// lives in the trust bundle. A new set is proposed (bcgw trust approvers
// propose, from the held epoch), endorsed where the approvers' keys are
// (bcgw trust approvers endorse, no gateway needed) and put into the bundle
// (bcgw trust approvers set). Agents take the first set as the bundle says,
// and a later one only at a higher epoch endorsed by at least the held
// set's threshold of its keys; bcgw stores what it is given and warns when
// agents will keep the old set.

// ---- admin API ----

func (s *API) adminSetApprovers(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, adminapi.MaxApproverSetFile+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	a, err := adminapi.DecodeApproverSet(b)
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
