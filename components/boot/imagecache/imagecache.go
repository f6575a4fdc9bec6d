// Package imagecache is the site agent's content-addressed image cache:
// kernels, initramfs images, ISOs and OS images pulled from https source
// URLs, named by their SHA-256, and served to PXE machines and ramdisks
// only once the bytes on disk are known to match that digest.
//
// A pull streams the download through SHA-256 into a temp file beside the
// cache and renames it into place only when the digest matches; a mismatch
// is an error and leaves nothing behind. Concurrent pulls of one digest
// download it once. The cache is trimmed least recently used first down to
// Config.MaxBytes, never evicting an image the keep set names (the images a
// spec still needs).
//
// Layout under Config.Dir:
//
//	blobs/<digest>        verified images, read-only
//	meta/<digest>.json    their source URL
//	tmp/                  downloads in progress (emptied on New)
package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/filehash"
	"github.com/better-compute/bcd/components/base/httpsurl"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// State is where an image is in its life.
type State string

// The states List reports.
const (
	StateReady   State = "READY"
	StatePulling State = "PULLING"
)

// Image is one entry of List.
type Image struct {
	// Digest is the lower-case hex SHA-256 of the image.
	Digest string
	// Source is the URL it was pulled from ("" for an image found on
	// disk without its metadata).
	Source string
	// Size is the image's size in bytes; for a pull in progress, the
	// bytes received so far.
	Size int64
	// State is READY or PULLING.
	State State
}

// Errors a caller may test for with errors.Is.
var (
	// ErrNotFound: no verified image with that digest.
	ErrNotFound = errors.New("image not in the cache")
	// ErrDigestMismatch: the downloaded bytes do not hash to the digest.
	ErrDigestMismatch = errors.New("downloaded image does not match its sha256")
	// ErrInvalidDigest: not 64 lower-case hex digits.
	ErrInvalidDigest = errors.New("digest must be 64 lower-case hex digits (sha256)")
)

// Config configures a Cache.
type Config struct {
	// Dir holds the cache; it is created (0700) if missing.
	Dir string
	// MaxBytes bounds the verified images on disk; 0 means no bound. An
	// image larger than MaxBytes is refused while it downloads.
	MaxBytes int64
	// Client downloads images; nil means a client with Go's default TLS
	// settings. Tests inject httptest.NewTLSServer's client.
	Client *http.Client
	// Log receives the cache's records; nil discards them.
	Log *slog.Logger
	// Changed, when set, is called after a pull starts or ends and after
	// an eviction, so the site agent can re-send its images inventory. It
	// must not call back into the Cache synchronously.
	Changed func()
}

// Cache is a content-addressed image cache. Its methods are safe for
// concurrent use.
type Cache struct {
	dir      string
	maxBytes int64
	client   *http.Client
	log      *slog.Logger
	changed  func()

	mu      sync.Mutex
	entries map[string]*entry
	keep    map[string]bool
	clock   uint64 // last-use counter for LRU order
}

// entry is one image, ready or being pulled.
type entry struct {
	source  string
	size    int64 // ready: the file size
	ready   bool
	lastUse uint64

	// While pulling: closed when the pull ends, with err its outcome.
	done     chan struct{}
	err      error
	received atomic.Int64
}

// New opens (or creates) the cache in cfg.Dir. Leftover downloads are
// removed; verified images already there are kept, ordered for eviction by
// their modification times.
func New(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("opening image cache: no directory")
	}
	if cfg.MaxBytes < 0 {
		return nil, errors.New("opening image cache: MaxBytes is negative")
	}
	c := &Cache{
		dir:      cfg.Dir,
		maxBytes: cfg.MaxBytes,
		client:   cfg.Client,
		log:      cfg.Log,
		changed:  cfg.Changed,
		entries:  map[string]*entry{},
		keep:     map[string]bool{},
	}
	if c.client == nil {
		c.client = &http.Client{}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.log = c.log.With("component", "imagecache")
	for _, d := range []string{c.dir, c.blobDir(), c.metaDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("opening image cache: %w", err)
		}
	}
	if err := os.RemoveAll(c.tmpDir()); err != nil {
		return nil, fmt.Errorf("opening image cache: removing leftover downloads: %w", err)
	}
	if err := os.Mkdir(c.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("opening image cache: %w", err)
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cache) blobDir() string { return filepath.Join(c.dir, "blobs") }
func (c *Cache) metaDir() string { return filepath.Join(c.dir, "meta") }
func (c *Cache) tmpDir() string  { return filepath.Join(c.dir, "tmp") }

func (c *Cache) blobPath(digest string) string { return filepath.Join(c.blobDir(), digest) }
func (c *Cache) metaPath(digest string) string {
	return filepath.Join(c.metaDir(), digest+".json")
}

// meta is the content of meta/<digest>.json.
type meta struct {
	Source string `json:"source"`
}

// load reads the verified images already on disk.
func (c *Cache) load() error {
	des, err := os.ReadDir(c.blobDir())
	if err != nil {
		return fmt.Errorf("opening image cache: %w", err)
	}
	type found struct {
		digest string
		e      *entry
		mtime  int64
	}
	var all []found
	for _, de := range des {
		digest := de.Name()
		info, err := de.Info()
		if err != nil || !filehash.ValidDigest(digest) || !info.Mode().IsRegular() {
			c.log.Warn("ignoring a file in the image cache that is not an image", "file", filepath.Join(c.blobDir(), digest))
			continue
		}
		e := &entry{size: info.Size(), ready: true}
		if b, err := os.ReadFile(c.metaPath(digest)); err == nil {
			var m meta
			if json.Unmarshal(b, &m) == nil {
				e.source = m.Source
			}
		}
		all = append(all, found{digest, e, info.ModTime().UnixNano()})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mtime < all[j].mtime })
	for _, f := range all {
		c.clock++
		f.e.lastUse = c.clock
		c.entries[f.digest] = f.e
	}
	return nil
}

// Pull makes the image with digest available, downloading it from
// sourceURL (https only) unless it is already cached. A pull of a digest
// already being pulled waits for that download instead of starting
// another, and returns its outcome. The download runs under the context of
// the call that started it.
func (c *Cache) Pull(ctx context.Context, digest, sourceURL string) error {
	if !filehash.ValidDigest(digest) {
		return fmt.Errorf("pulling image: %w", ErrInvalidDigest)
	}
	if err := httpsurl.Check(sourceURL); err != nil {
		return fmt.Errorf("pulling image %s: %w", digest, err)
	}

	c.mu.Lock()
	if e, ok := c.entries[digest]; ok {
		if e.ready {
			c.touchLocked(e)
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		select {
		case <-e.done:
			return e.err
		case <-ctx.Done():
			return fmt.Errorf("pulling image %s: waiting for the download in progress: %w", digest, ctx.Err())
		}
	}
	e := &entry{source: sourceURL, done: make(chan struct{})}
	c.entries[digest] = e
	c.mu.Unlock()
	c.notify()
	c.log.Info("image pull started", "digest", digest, "source", httpsurl.Redact(sourceURL))

	size, err := c.download(ctx, digest, sourceURL, e)

	c.mu.Lock()
	if err != nil {
		delete(c.entries, digest)
		e.err = err
	} else {
		e.ready = true
		e.size = size
		c.touchLocked(e)
	}
	close(e.done)
	c.mu.Unlock()
	if err != nil {
		c.log.Warn("image pull failed", "digest", digest, "source", httpsurl.Redact(sourceURL), "err", err)
	} else {
		c.log.Info("image pull done", "digest", digest, "size", size)
	}
	c.notify()
	if err == nil {
		if _, terr := c.Trim(); terr != nil {
			c.log.Warn("trimming the image cache", "err", terr)
		}
	}
	return err
}

// download fetches sourceURL into a temp file, hashing as it writes, and
// renames it into blobs/ only when the hash is digest.
func (c *Cache) download(ctx context.Context, digest, sourceURL string, e *entry) (int64, error) {
	wrap := func(err error) error { return fmt.Errorf("pulling image %s: %w", digest, err) }
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sourceURL, nil)
	if err != nil {
		return 0, wrap(fmt.Errorf("building the request: %w", httpsurl.RedactErr(err, sourceURL)))
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, wrap(fmt.Errorf("GET %s: %w", httpsurl.Redact(sourceURL), httpsurl.RedactErr(err, sourceURL)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, wrap(fmt.Errorf("GET %s: status %s", httpsurl.Redact(sourceURL), resp.Status))
	}
	if c.maxBytes > 0 && resp.ContentLength > c.maxBytes {
		return 0, wrap(fmt.Errorf("the image is %d bytes, more than the cache's %d", resp.ContentLength, c.maxBytes))
	}

	f, err := os.CreateTemp(c.tmpDir(), digest+".*")
	if err != nil {
		return 0, wrap(fmt.Errorf("creating a temp file: %w", err))
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	defer f.Close()

	h := sha256.New()
	var body io.Reader = resp.Body
	if c.maxBytes > 0 {
		body = io.LimitReader(resp.Body, c.maxBytes+1)
	}
	n, err := io.Copy(io.MultiWriter(f, h, counter{&e.received}), body)
	if err != nil {
		return 0, wrap(fmt.Errorf("downloading from %s: %w", httpsurl.Redact(sourceURL), httpsurl.RedactErr(err, sourceURL)))
	}
	if c.maxBytes > 0 && n > c.maxBytes {
		return 0, wrap(fmt.Errorf("the image is more than the cache's %d bytes", c.maxBytes))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != digest {
		return 0, wrap(fmt.Errorf("%w: got sha256 %s after %d bytes", ErrDigestMismatch, got, n))
	}
	if err := f.Chmod(0o400); err != nil {
		return 0, wrap(err)
	}
	if err := f.Sync(); err != nil {
		return 0, wrap(fmt.Errorf("syncing the download: %w", err))
	}
	if err := f.Close(); err != nil {
		return 0, wrap(fmt.Errorf("closing the download: %w", err))
	}
	mb, _ := json.Marshal(meta{Source: sourceURL})
	if err := os.WriteFile(c.metaPath(digest), mb, 0o600); err != nil {
		return 0, wrap(fmt.Errorf("writing its metadata: %w", err))
	}
	if err := os.Rename(tmp, c.blobPath(digest)); err != nil {
		return 0, wrap(fmt.Errorf("moving it into place: %w", err))
	}
	if d, err := os.Open(c.blobDir()); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return n, nil
}

// counter counts bytes written through it.
type counter struct{ n *atomic.Int64 }

func (c counter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// Open opens the verified image with digest for reading and marks it
// used. An image still being pulled, or never pulled, is ErrNotFound.
func (c *Cache) Open(digest string) (*os.File, error) {
	if !filehash.ValidDigest(digest) {
		return nil, fmt.Errorf("opening image: %w", ErrInvalidDigest)
	}
	c.mu.Lock()
	e, ok := c.entries[digest]
	if !ok || !e.ready {
		c.mu.Unlock()
		return nil, fmt.Errorf("opening image %s: %w", digest, ErrNotFound)
	}
	c.touchLocked(e)
	// Opened under the lock, so Trim cannot remove it in between.
	f, err := os.Open(c.blobPath(digest))
	c.mu.Unlock()
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("opening image %s: %w", digest, ErrNotFound)
		}
		return nil, fmt.Errorf("opening image %s: %w", digest, err)
	}
	return f, nil
}

// touchLocked marks e as just used.
func (c *Cache) touchLocked(e *entry) {
	c.clock++
	e.lastUse = c.clock
}

// List returns every image, ready or being pulled, sorted by digest.
func (c *Cache) List() []Image {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Image, 0, len(c.entries))
	for d, e := range c.entries {
		img := Image{Digest: d, Source: e.source, Size: e.size, State: StateReady}
		if !e.ready {
			img.State = StatePulling
			img.Size = e.received.Load()
		}
		out = append(out, img)
	}
	slices.SortFunc(out, func(a, b Image) int {
		switch {
		case a.Digest < b.Digest:
			return -1
		case a.Digest > b.Digest:
			return 1
		}
		return 0
	})
	return out
}

// SetKeep replaces the set of digests eviction must spare (the images the
// site's specs still name) and trims the cache against it.
func (c *Cache) SetKeep(digests []string) error {
	keep := make(map[string]bool, len(digests))
	for _, d := range digests {
		keep[d] = true
	}
	c.mu.Lock()
	c.keep = keep
	c.mu.Unlock()
	_, err := c.Trim()
	return err
}

// Trim evicts ready images, least recently used first, until the ready
// images fit in MaxBytes, sparing the keep set. It returns the digests it
// removed. When only kept images remain the cache may stay above
// MaxBytes; Trim logs that and returns no error for it.
func (c *Cache) Trim() ([]string, error) {
	if c.maxBytes == 0 {
		return nil, nil
	}
	c.mu.Lock()
	var total int64
	type cand struct {
		digest string
		e      *entry
	}
	var cands []cand
	for d, e := range c.entries {
		if !e.ready {
			continue
		}
		total += e.size
		if !c.keep[d] {
			cands = append(cands, cand{d, e})
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].e.lastUse < cands[j].e.lastUse })
	var evicted []string
	var errs []error
	for _, cd := range cands {
		if total <= c.maxBytes {
			break
		}
		if err := os.Remove(c.blobPath(cd.digest)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("evicting image %s: %w", cd.digest, err))
			continue
		}
		_ = os.Remove(c.metaPath(cd.digest))
		delete(c.entries, cd.digest)
		total -= cd.e.size
		evicted = append(evicted, cd.digest)
	}
	over := total > c.maxBytes
	c.mu.Unlock()

	for _, d := range evicted {
		c.log.Info("image evicted", "digest", d)
	}
	if over {
		c.log.Warn("image cache stays above its bound: the rest are kept images", "bytes", total, "max_bytes", c.maxBytes)
	}
	if len(evicted) > 0 {
		c.notify()
	}
	return evicted, errors.Join(errs...)
}

func (c *Cache) notify() {
	if c.changed != nil {
		c.changed()
	}
}
