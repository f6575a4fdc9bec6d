package admin

import (
	"errors"
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// Operator secrets (bcgw secret): set and deleted by name and node, listed
// without values. A value travels only in a PUT's body; no answer, log
// line or error holds it.

func (s *API) secretRoutes(mux *http.ServeMux) {
	mux.HandleFunc("PUT /v1/secrets", s.adminSetSecret)
	mux.HandleFunc("DELETE /v1/secrets", s.adminDeleteSecret)
	mux.HandleFunc("GET /v1/secrets", s.adminSecrets)
}

func (s *API) adminSetSecret(w http.ResponseWriter, r *http.Request) {
	var req adminapi.SecretRequest
	if err := decodeBody(r, &req); err != nil {
		// The JSON decoder's errors name offsets and types, not values.
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	v := []byte(req.Value)
	defer clear(v)
	name, err := s.SetSecret(req.Name, req.Node, v)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.SecretView{Name: name, Node: req.Node})
}

func (s *API) adminDeleteSecret(w http.ResponseWriter, r *http.Request) {
	var req adminapi.SecretRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if req.Value != "" {
		adminErr(w, http.StatusBadRequest, errors.New("a secret is deleted by name and node, without a value"))
		return
	}
	name, err := s.DeleteSecret(req.Name, req.Node)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.SecretView{Name: name, Node: req.Node})
}

func (s *API) adminSecrets(w http.ResponseWriter, r *http.Request) {
	v, err := s.Secrets()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, v)
}
