package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

func (s *API) adminStatus(w http.ResponseWriter, r *http.Request) {
	v, err := s.Status(r.PathValue("id"))
	if err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, v)
}

func (s *API) adminEvents(w http.ResponseWriter, r *http.Request) {
	var after uint64
	if a := r.URL.Query().Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseUint(a, 10, 64); err != nil {
			adminErr(w, http.StatusBadRequest, errors.New("after must be an event seq (a whole number)"))
			return
		}
	}
	evs, err := s.Events(r.PathValue("id"), after)
	if err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), fmt.Errorf("%w (bcgw nodes lists the nodes this gateway knows)", err))
		return
	}
	writeJSON(w, evs)
}
