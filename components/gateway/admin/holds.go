package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func (s *API) adminHold(w http.ResponseWriter, r *http.Request) {
	var h adminapi.HoldRequest
	if err := decodeBody(r, &h); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	gen, err := s.Hold(r.PathValue("id"), h)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.GenerationView{Generation: gen})
}

func (s *API) adminRelease(w http.ResponseWriter, r *http.Request) {
	gen, err := s.Release(r.PathValue("id"), r.PathValue("alloc"))
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.GenerationView{Generation: gen})
}
