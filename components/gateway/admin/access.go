package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func (s *API) adminSSHCA(w http.ResponseWriter, r *http.Request) {
	var req adminapi.SSHCARequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v, err := s.SSHCA(req)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, v)
}

func (s *API) adminSSHSign(w http.ResponseWriter, r *http.Request) {
	var req adminapi.SSHSignRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v, err := s.SSHSign(req)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, v)
}
