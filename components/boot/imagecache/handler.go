package imagecache

import (
	"errors"
	"github.com/better-compute/bcd/components/base/filehash"
	"net/http"
	"strings"
)

// Handler serves verified images at GET (and HEAD) /images/<digest>, with
// range requests. A path that is not exactly /images/ and 64 lower-case
// hex digits is 404, so nothing but a cached image can be named; an image
// not cached (or still being pulled) is 404 as well.
//
// Mount it at the root of the boot server's mux, or under a prefix with
// http.StripPrefix.
func (c *Cache) Handler() http.Handler {
	return http.HandlerFunc(c.serveHTTP)
}

func (c *Cache) serveHTTP(w http.ResponseWriter, r *http.Request) {
	digest, ok := strings.CutPrefix(r.URL.Path, "/images/")
	if !ok || !filehash.ValidDigest(digest) || strings.Contains(r.URL.RawPath, "%") {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	f, err := c.Open(digest)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			c.log.Warn("serving image", "digest", digest, "err", err)
		}
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		c.log.Warn("serving image", "digest", digest, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"sha256:`+digest+`"`)
	h.Set("Cache-Control", "public, max-age=31536000, immutable")
	http.ServeContent(w, r, "", info.ModTime(), f)
}
