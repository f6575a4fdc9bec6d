package bootserver

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/better-compute/bcd/components/boot/imagecache"
)

// CacheImage is one image the site's desired state names.
type CacheImage struct {
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}

// Cache image states of the site section.
const (
	CacheReady       = "READY"
	CacheProgressing = "PROGRESSING"
)

// Warmer keeps the cache_images of the site's desired state in the image
// cache: it pulls them in the background and reports the images section
// (every cached image: digest, source, size, READY or PULLING) and whether
// cache_images are PROGRESSING, READY or failed, each time that changes.
type Warmer struct {
	Cache   *imagecache.Cache
	Entries *Entries
	Log     *slog.Logger

	mu      sync.Mutex
	want    []CacheImage
	state   string
	publish func([]byte)
	kick    chan struct{}
}

// NewWarmer makes a warmer; Run starts it.
func NewWarmer(c *imagecache.Cache, e *Entries, log *slog.Logger) *Warmer {
	return &Warmer{Cache: c, Entries: e, Log: log, state: CacheReady, kick: make(chan struct{}, 1)}
}

// SetPublish gives the warmer the session's report function.
func (w *Warmer) SetPublish(f func([]byte)) {
	w.mu.Lock()
	w.publish = f
	w.mu.Unlock()
	w.Report()
}

// Apply takes a desired-state patch; one without site.cache_images changes
// nothing.
func (w *Warmer) Apply(spec []byte) error {
	var s struct {
		Site *struct {
			CacheImages *[]CacheImage `json:"cache_images"`
		} `json:"site"`
	}
	if err := json.Unmarshal(spec, &s); err != nil {
		return fmt.Errorf("desired state site section: %w", err)
	}
	if s.Site == nil || s.Site.CacheImages == nil {
		return nil
	}
	w.mu.Lock()
	w.want = *s.Site.CacheImages
	w.mu.Unlock()
	w.Keep()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	return nil
}

// Keep spares what entries, cache_images and extra name from eviction.
func (w *Warmer) Keep(extra ...string) {
	w.mu.Lock()
	keep := append(w.Entries.Digests(), extra...)
	for _, im := range w.want {
		keep = append(keep, im.SHA256)
	}
	w.mu.Unlock()
	_ = w.Cache.SetKeep(keep)
}

// Report publishes the images section and the cache_images state.
func (w *Warmer) Report() {
	w.mu.Lock()
	pub, state := w.publish, w.state
	w.mu.Unlock()
	if pub == nil {
		return
	}
	type image struct {
		Digest string `json:"digest"`
		Source string `json:"source"`
		Size   int64  `json:"size"`
		State  string `json:"state"`
	}
	images := []image{}
	for _, im := range w.Cache.List() {
		images = append(images, image{Digest: im.Digest, Source: im.Source, Size: im.Size, State: string(im.State)})
	}
	b, err := json.Marshal(map[string]any{
		"images": images,
		"site":   map[string]string{"cache_images": state},
	})
	if err == nil {
		pub(b)
	}
}

func (w *Warmer) setState(s string) {
	w.mu.Lock()
	w.state = s
	w.mu.Unlock()
	w.Report()
}

// Run pulls what cache_images name whenever they change, until ctx ends.
func (w *Warmer) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.kick:
		}
		w.mu.Lock()
		want := append([]CacheImage(nil), w.want...)
		w.mu.Unlock()
		w.setState(CacheProgressing)
		state := CacheReady
		for _, im := range want {
			if err := w.Cache.Pull(ctx, im.SHA256, im.URL); err != nil {
				w.Log.Warn("cache image pull failed", "sha256", im.SHA256, "err", err)
				state = "FAILED: " + err.Error()
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		w.setState(state)
	}
}
