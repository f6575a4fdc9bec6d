package admin

import (
	"fmt"
	"io"
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// Destructive batches (components/trust/quorum): once the trust bundle
// names approvers, agents run a destructive command only as a leaf of a
// batch that at least threshold approvers approved. A batch is made from
// prepared commands (bcgw batch create, no gateway needed), approved where
// each approver's key is (bcgw batch approve, no gateway needed) and
// submitted (bcgw batch submit): each command goes out as bcgw run
// --submit sends it, with its BatchLeaf attached and stored with it.

// ---- admin API ----

func (s *API) adminSubmitBatch(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, adminapi.MaxBatchFile+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	bf, err := adminapi.DecodeBatch(b)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v, err := s.SubmitBatch(bf)
	if err != nil {
		code := errCode(err, http.StatusBadRequest)
		if len(v.Commands) > 0 {
			code = http.StatusInternalServerError
		}
		adminErr(w, code, err)
		return
	}
	writeJSON(w, v)
}
