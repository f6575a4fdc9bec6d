package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// ---- admin API ----

func (s *API) adminTrust(w http.ResponseWriter, r *http.Request) {
	v, err := s.Trust()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, v)
}

func (s *API) adminTrustRoot(remove bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req adminapi.TrustRootRequest
		if err := decodeBody(r, &req); err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		var c adminapi.TrustChange
		var err error
		if remove {
			c, err = s.RemoveTrustRoot(req.SPKI)
		} else {
			c, err = s.AddTrustRoot(req.SPKI)
		}
		if err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, c)
	}
}
