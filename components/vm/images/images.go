// Package images keeps a node's base images for its instances under
// data_dir/images, each named by its SHA-256 and format
// (<sha256>.<format>). A fetch is over https only, through the image's
// SPKI pin or the system's roots as the instances section says, a
// redirect included; the bytes stream through SHA-256 into a temporary
// file beside the store and are renamed into place only when the digest
// matches and, for a qcow2 image, its header passes the base image check
// (components/vm/qcow2: no backing file, no data file, no encryption).
// Raw and iso images are never probed. Ready checks a qcow2 image's header
// again before each use. Keep removes every image no instance names.
// docs/instances.md describes the store.
package images

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/filehash"
	"github.com/better-compute/bcd/components/base/httpsurl"
	"github.com/better-compute/bcd/components/base/stall"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/spec"
)

// DefaultMaxBytes bounds one image.
const DefaultMaxBytes = 256 << 30

// ErrNotFetched is an image the store does not hold.
var ErrNotFetched = errors.New("image not fetched yet")

// ErrRefused is an image that arrived and failed its checks (its SHA-256
// differs, or its qcow2 header is refused): fetching again will not mend
// it.
var ErrRefused = errors.New("image refused")

// Base is a base image the store holds.
type Base struct {
	Path string
	// VirtualSize is what a guest sees: a qcow2 image's virtual size, a
	// raw or iso image's length.
	VirtualSize int64
}

// Config configures a Store.
type Config struct {
	// Dir is data_dir/images.
	Dir string
	// Roots are the roots of an image without a pin; nil: the system's.
	Roots *x509.CertPool
	// MaxBytes bounds one image; 0: DefaultMaxBytes.
	MaxBytes int64
	// Stall ends a download that stops moving (zero: less than 1 MiB in
	// 2 minutes).
	Stall stall.Rule
}

// Store holds verified base images.
type Store struct {
	cfg   Config
	mu    sync.Mutex
	locks map[string]*sync.Mutex // per digest: one fetch at a time
}

// New opens the store, creating Dir (0750) and emptying its tmp/.
func New(cfg Config) (*Store, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	tmp := filepath.Join(cfg.Dir, "tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	if err := os.Chmod(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	return &Store{cfg: cfg, locks: map[string]*sync.Mutex{}}, nil
}

// Path is where im is kept.
func (s *Store) Path(im spec.Image) string {
	return filepath.Join(s.cfg.Dir, im.SHA256+"."+im.Format)
}

func (s *Store) lock(digest string) func() {
	s.mu.Lock()
	l, ok := s.locks[digest]
	if !ok {
		l = &sync.Mutex{}
		s.locks[digest] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// check refuses what the section would refuse, before any request.
func check(im spec.Image) error {
	if !filehash.ValidDigest(im.SHA256) {
		return fmt.Errorf("images: %q is not a SHA-256", im.SHA256)
	}
	switch im.Format {
	case spec.QCOW2, spec.Raw, spec.ISO:
	default:
		return fmt.Errorf("images: format %q is not qcow2, raw or iso", im.Format)
	}
	if err := httpsurl.Check(im.URL); err != nil {
		return fmt.Errorf("images: %s: %w", httpsurl.Redact(im.URL), err)
	}
	return nil
}

// Ready returns im when the store holds it, a qcow2 image's header
// checked again; ErrNotFetched when it does not.
func (s *Store) Ready(im spec.Image) (Base, error) {
	if err := check(im); err != nil {
		return Base{}, err
	}
	b := Base{Path: s.Path(im)}
	st, err := os.Lstat(b.Path)
	if errors.Is(err, os.ErrNotExist) {
		return Base{}, fmt.Errorf("images: %s: %w", im.SHA256, ErrNotFetched)
	} else if err != nil {
		return Base{}, fmt.Errorf("images: %w", err)
	}
	b.VirtualSize = st.Size()
	if im.Format == spec.QCOW2 {
		h, err := qcow2.CheckFile(b.Path, qcow2.Backing{})
		if err != nil {
			return Base{}, fmt.Errorf("images: base image: %w: %w", ErrRefused, err)
		}
		b.VirtualSize = int64(h.VirtualSize)
	}
	return b, nil
}

// Fetch makes the store hold im: nothing when it does, else a download
// verified as the package says. A failed fetch leaves nothing behind.
func (s *Store) Fetch(ctx context.Context, im spec.Image) error {
	if err := check(im); err != nil {
		return err
	}
	defer s.lock(im.SHA256)()
	if _, err := os.Lstat(s.Path(im)); err == nil {
		return nil
	}
	client, err := s.client(im)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Join(s.cfg.Dir, "tmp"), im.SHA256+".*")
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = s.download(ctx, client, im, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("images: %w", cerr)
	}
	if err != nil {
		return err
	}
	if im.Format == spec.QCOW2 {
		if _, err := qcow2.CheckFile(tmp, qcow2.Backing{}); err != nil {
			// Without the temporary file's name, which differs each time.
			if inner := errors.Unwrap(err); inner != nil {
				err = inner
			}
			return fmt.Errorf("images: %s %w as a base image: %w", im.SHA256, ErrRefused, err)
		}
	}
	// QEMU reads base images through the node's group.
	if err := os.Chmod(tmp, 0o640); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	if err := os.Rename(tmp, s.Path(im)); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	atomicfile.SyncDir(s.cfg.Dir)
	return nil
}

func (s *Store) download(ctx context.Context, client *http.Client, im spec.Image, f *os.File) error {
	src := httpsurl.Redact(im.URL)
	ctx, counted, stop := stall.Watch(ctx, s.cfg.Stall)
	defer stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, im.URL, nil)
	if err != nil {
		return fmt.Errorf("images: %s: %w", src, httpsurl.RedactErr(err, im.URL))
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("images: fetch %s: %w", src, stall.Err(ctx, httpsurl.RedactErr(err, im.URL)))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("images: fetch %s: %s", src, resp.Status)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), counted.Reader(io.LimitReader(resp.Body, s.cfg.MaxBytes+1)))
	if err != nil {
		return fmt.Errorf("images: fetch %s: %w", src, stall.Err(ctx, httpsurl.RedactErr(err, im.URL)))
	}
	if n > s.cfg.MaxBytes {
		return fmt.Errorf("images: %s is larger than %d bytes", src, s.cfg.MaxBytes)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != im.SHA256 {
		return fmt.Errorf("images: %w: %s has SHA-256 %s, not %s", ErrRefused, src, got, im.SHA256)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	return nil
}

// client is an https client for im: its pin, or the configured roots;
// a redirect only to https, verified the same way.
func (s *Store) client(im spec.Image) (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: s.cfg.Roots}
	pinnedHost := ""
	if im.SPKIPin != "" {
		want, err := pki.ParsePin(im.SPKIPin)
		if err != nil {
			return nil, fmt.Errorf("images: spki_pin: %w", err)
		}
		u, err := url.Parse(im.URL)
		if err != nil {
			return nil, fmt.Errorf("images: %s: not a URL", httpsurl.Redact(im.URL))
		}
		host := u.Hostname()
		// The pin replaces the roots: VerifyConnection checks every
		// handshake for the URL's host (a redirect must stay on it).
		tc.RootCAs, tc.InsecureSkipVerify = nil, true
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			return pki.VerifyPinnedChain(cs.PeerCertificates, want, host, "image server", "spki_pin")
		}
		pinnedHost = u.Host
	}
	return &http.Client{
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			TLSClientConfig:       tc,
			TLSHandshakeTimeout:   30 * time.Second,
			ResponseHeaderTimeout: time.Minute,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s refused: images come over https only", req.URL.Scheme)
			}
			if pinnedHost != "" && req.URL.Host != pinnedHost {
				return fmt.Errorf("redirect to another host refused: the image's pin is for %s", pinnedHost)
			}
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			return nil
		},
	}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.cfg.Dir }

// Unneeded lists the files the store holds (and what was made of them
// beside: a directory named <digest>.<anything>) whose digest is not in
// keep.
func (s *Store) Unneeded(keep []string) ([]string, error) {
	entries, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	var out []string
	for _, e := range entries {
		digest, _, ok := strings.Cut(e.Name(), ".")
		if ok && filehash.ValidDigest(digest) && !slices.Contains(keep, digest) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Keep removes every image whose digest is not in keep (the images an
// instance names) and reports the files it removed.
func (s *Store) Keep(keep []string) ([]string, error) {
	names, err := s.Unneeded(keep)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range names {
		digest, _, _ := strings.Cut(n, ".")
		unlock := s.lock(digest)
		err := os.RemoveAll(filepath.Join(s.cfg.Dir, n))
		unlock()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("images: %w", err)
		}
		removed = append(removed, n)
	}
	if len(removed) > 0 {
		atomicfile.SyncDir(s.cfg.Dir)
	}
	return removed, nil
}
