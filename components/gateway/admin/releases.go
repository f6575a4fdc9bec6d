package admin

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
)

func (s *API) adminUploadArtifact(w http.ResponseWriter, r *http.Request) {
	n, err := s.UploadArtifact(r.PathValue("sha256"), r.Body)
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("upload: %w", err))
		return
	}
	writeJSON(w, map[string]int64{"size": n})
}

func (s *API) adminPublishRelease(w http.ResponseWriter, r *http.Request) {
	var req adminapi.PublishRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	p, err := s.PublishRelease(req.Doc, req.Artifacts)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, store.ErrReleaseConflict) {
			code = http.StatusConflict
		}
		adminErr(w, code, err)
		return
	}
	s.log.Info("release published", "version", p.Version, "sequence", p.Sequence, "served", p.Served, "shared", p.Shared)
	writeJSON(w, p)
}

func (s *API) adminReleaseDoc(w http.ResponseWriter, r *http.Request) {
	v := r.PathValue("version")
	b, err := s.ReleaseDoc(v)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("release %s is not published (bcgw release publish): %w", v, err)
	}
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, adminapi.ReleaseDocView{Doc: b})
}

func (s *API) adminReleases(w http.ResponseWriter, r *http.Request) {
	rs, err := s.Releases()
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, rs)
}
