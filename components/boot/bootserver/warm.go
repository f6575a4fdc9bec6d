package bootserver

import (
	"context"
	"encoding/json"
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
	// Discoveries, when set, are reported as the "discovered" section.
	Discoveries *Discoveries

	// Changed, when set, is called after each pull round ends (the site
	// section's engine checks again then).
	Changed func()

	mu      sync.Mutex
	want    []CacheImage
	state   string
	publish func([]byte)
	kick    chan struct{}
	// asked counts SetWant calls; done is the count the last finished
	// round started from, and failed what it could not pull.
	asked, done uint64
	failed      string
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

// SetWant sets the images to keep cached and starts a pull round (also
// when they are the same: a retry after a failure).
func (w *Warmer) SetWant(images []CacheImage) {
	w.mu.Lock()
	w.want = append([]CacheImage(nil), images...)
	w.asked++
	w.mu.Unlock()
	w.Keep()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Want returns the images last set.
func (w *Warmer) Want() []CacheImage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]CacheImage(nil), w.want...)
}

// Settled reports whether a pull round started after the last SetWant
// has finished, and what it failed to pull ("" when all are cached).
func (w *Warmer) Settled() (bool, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done == w.asked, w.failed
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
	discovered := []Discovered{}
	if w.Discoveries != nil {
		discovered = w.Discoveries.List()
	}
	b, err := json.Marshal(map[string]any{
		"images":     images,
		"site":       map[string]string{"cache_images": state},
		"discovered": discovered,
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
		asked := w.asked
		w.mu.Unlock()
		w.setState(CacheProgressing)
		state, failed := CacheReady, ""
		for _, im := range want {
			if err := w.Cache.Pull(ctx, im.SHA256, im.URL); err != nil {
				w.Log.Warn("cache image pull failed", "sha256", im.SHA256, "err", err)
				state = "FAILED: " + err.Error()
				failed = err.Error()
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		w.mu.Lock()
		w.done, w.failed = asked, failed
		w.mu.Unlock()
		w.setState(state)
		if w.Changed != nil {
			w.Changed()
		}
	}
}
