package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// MaxStatusReport bounds a stored StatusReport.
const MaxStatusReport = 1 << 20

// CacheImage is one image a site should keep in its cache.
type CacheImage struct {
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}

func statusKey(node string) string      { return "status/" + node }
func cacheImagesKey(node string) string { return "cacheimages/" + node }

// storeStatus keeps a node's latest StatusReport sections.
func (s *Server) storeStatus(node string, sections []byte) error {
	if len(sections) > MaxStatusReport || !json.Valid(sections) {
		return errors.New("status report is not JSON of at most 1 MiB")
	}
	return s.store.SetMeta(statusKey(node), sections)
}

// cacheImagesFrame is the DesiredState patch naming a site's cache_images.
func (s *Server) cacheImagesFrame(images []CacheImage) *bcdv1.GatewayFrame {
	var spec struct {
		Site struct {
			CacheImages []CacheImage `json:"cache_images"`
		} `json:"site"`
	}
	spec.Site.CacheImages = images
	b, _ := json.Marshal(spec)
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_DesiredState{DesiredState: &bcdv1.DesiredState{
		Generation: s.leases.next(), Patch: true, Spec: b,
	}}}
}

// siteWelcome sends a site agent the desired state it keeps across
// sessions (cache_images).
func (s *Server) siteWelcome(n store.Node, l *live) {
	b, _ := s.store.Meta(cacheImagesKey(n.ID))
	var images []CacheImage
	if json.Unmarshal(b, &images) == nil && images != nil {
		l.push(outFrame{f: s.cacheImagesFrame(images)})
	}
}

// SetCacheImages records what a site should cache and tells it.
func (s *Server) SetCacheImages(node string, images []CacheImage) error {
	n, err := s.store.Node(node)
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if n.Role != "site" {
		return fmt.Errorf("node %s is a %s, not a site agent", node, n.Role)
	}
	if images == nil {
		images = []CacheImage{}
	}
	b, _ := json.Marshal(images)
	if err := s.store.SetMeta(cacheImagesKey(node), b); err != nil {
		return err
	}
	s.hub.send(node, s.cacheImagesFrame(images))
	return nil
}

func (s *Server) adminStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.store.Meta(statusKey(r.PathValue("id")))
	if err != nil || len(b) == 0 {
		adminErr(w, http.StatusNotFound, errors.New("no status report from this node"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
}

func (s *Server) adminCacheImages(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Images []CacheImage `json:"images"`
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
