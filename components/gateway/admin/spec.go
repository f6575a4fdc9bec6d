package admin

import (
	"fmt"
	"io"
	"net/http"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func (s *API) adminSpec(w http.ResponseWriter, r *http.Request) {
	gen, spec, err := s.Spec(r.PathValue("id"))
	if err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, adminapi.SpecView{Generation: gen, Spec: spec})
}

// adminSetSpec serves PUT (the body is the full spec) and PATCH (the body
// is an RFC 7396 merge patch). The body is the JSON itself, up to the
// spec's own bound (4 MiB), not the admin API's 2 MiB.
func (s *API) adminSetSpec(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, nodespec.MaxBytes+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	if len(b) > nodespec.MaxBytes {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body is over 4 MiB: a spec or a patch is at most %d bytes; nothing stored", nodespec.MaxBytes))
		return
	}
	var gen uint64
	if r.Method == http.MethodPatch {
		gen, err = s.PatchSpec(r.PathValue("id"), b)
	} else {
		gen, err = s.SetSpec(r.PathValue("id"), b)
	}
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.GenerationView{Generation: gen})
}
