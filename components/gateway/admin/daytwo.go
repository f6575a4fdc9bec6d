package admin

import (
	"errors"
	"net/http"
)

func (s *API) adminRemoveNode(w http.ResponseWriter, r *http.Request) {
	if err := s.RemoveNode(r.PathValue("id")); err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, map[string]bool{"removed": true})
}

func (s *API) adminJoinTokens(w http.ResponseWriter, r *http.Request) {
	ts, err := s.JoinTokens()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, ts)
}

func (s *API) adminRemoveJoinToken(w http.ResponseWriter, r *http.Request) {
	if err := s.RemoveJoinToken(r.PathValue("id")); err != nil {
		adminErr(w, errCode(err, http.StatusInternalServerError), err)
		return
	}
	writeJSON(w, map[string]bool{"removed": true})
}

func (s *API) adminRotateCommandKey(w http.ResponseWriter, r *http.Request) {
	v, err := s.RotateCommandKey()
	if err != nil {
		adminErr(w, http.StatusConflict, err)
		return
	}
	writeJSON(w, v)
}

// adminBackup streams a consistent copy of the bbolt store. A failure
// once bytes went out cuts the answer short; the client checks the copy.
func (s *API) adminBackup(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/octet-stream")
	n, err := s.Backup(w)
	if err != nil && n == 0 {
		adminErr(w, http.StatusConflict, err)
		return
	}
	if err != nil {
		s.log.Error("backup cut short", "bytes", n, "err", err)
		return
	}
	s.log.Info("store backed up", "bytes", n, "actor", actorOf(r))
}

func (s *API) adminRenewServing(w http.ResponseWriter, r *http.Request) {
	if s.cfg.RenewServing == nil {
		adminErr(w, http.StatusNotImplemented, errors.New("this gateway cannot renew its serving certificate"))
		return
	}
	v, err := s.cfg.RenewServing()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, v)
}
