package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func (s *API) adminCacheImages(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Images []adminapi.CacheImage `json:"images"`
	}
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if err := s.SetCacheImages(r.PathValue("id"), req.Images); err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, map[string]int{"images": len(req.Images)})
}
