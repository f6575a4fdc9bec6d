package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func (s *API) adminTPMEnroll(w http.ResponseWriter, r *http.Request) {
	var req adminapi.TPMEnrollRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	out, err := s.EnrollTPM(req)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, out)
}
