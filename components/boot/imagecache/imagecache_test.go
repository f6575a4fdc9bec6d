package imagecache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// origin is an https source server for tests: it serves files by path and
// counts requests per path.
type origin struct {
	srv   *httptest.Server
	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
	// gate, when set, holds every response until it is closed.
	gate chan struct{}
	// started receives the path of every request as it arrives.
	started chan string
}

func newOrigin(t *testing.T) *origin {
	o := &origin{files: map[string][]byte{}, hits: map[string]int{}, started: make(chan string, 64)}
	o.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.mu.Lock()
		o.hits[r.URL.Path]++
		b, ok := o.files[r.URL.Path]
		gate := o.gate
		o.mu.Unlock()
		o.started <- r.URL.Path
		if gate != nil {
			<-gate
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func (o *origin) put(path string, b []byte) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.files[path] = b
	return o.srv.URL + path
}

func (o *origin) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.hits[path]
}

func newCache(t *testing.T, o *origin, maxBytes int64) (*Cache, string) {
	t.Helper()
	dir := t.TempDir()
	c, err := New(Config{Dir: dir, MaxBytes: maxBytes, Client: o.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return c, dir
}

func get(t *testing.T, h http.Handler, method, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, "http://boot.test"+path, nil)
	h.ServeHTTP(rec, req)
	return rec
}

func TestPullAndServe(t *testing.T) {
	o := newOrigin(t)
	kernel := bytes.Repeat([]byte("kernel "), 1000)
	d := digestOf(kernel)
	src := o.put("/vmlinuz", kernel)
	changes := atomic.Int32{}
	dir := t.TempDir()
	c, err := New(Config{Dir: dir, Client: o.srv.Client(), Changed: func() { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.Open(d); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Open before Pull: %v, want ErrNotFound", err)
	}
	if err := c.Pull(context.Background(), d, src); err != nil {
		t.Fatalf("Pull: %v", err)
	}
	if n := changes.Load(); n != 2 {
		t.Errorf("Changed called %d times, want 2 (start and end)", n)
	}
	if got := c.List(); len(got) != 1 || got[0] != (Image{Digest: d, Source: src, Size: int64(len(kernel)), State: StateReady}) {
		t.Errorf("List = %+v", got)
	}

	f, err := c.Open(d)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if !bytes.Equal(b, kernel) {
		t.Error("Open returned other bytes")
	}

	rec := get(t, c.Handler(), http.MethodGet, "/images/"+d)
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), kernel) {
		t.Fatalf("GET /images/<digest>: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("Content-Type %q", ct)
	}

	// A second pull of a ready image does not download again.
	if err := c.Pull(context.Background(), d, src); err != nil {
		t.Fatal(err)
	}
	if n := o.count("/vmlinuz"); n != 1 {
		t.Errorf("origin hit %d times, want 1", n)
	}

	// A new Cache on the same directory finds the image, with its source.
	c2, err := New(Config{Dir: dir, Client: o.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	if got := c2.List(); len(got) != 1 || got[0].State != StateReady || got[0].Source != src {
		t.Errorf("List after reopening = %+v", got)
	}
}

func TestDigestMismatchNeverServed(t *testing.T) {
	o := newOrigin(t)
	want := []byte("the real initramfs")
	d := digestOf(want)
	src := o.put("/initrd", []byte("a tampered initramfs"))
	c, dir := newCache(t, o, 0)

	err := c.Pull(context.Background(), d, src)
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Pull: %v, want ErrDigestMismatch", err)
	}
	if _, err := c.Open(d); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open after a mismatch: %v, want ErrNotFound", err)
	}
	if got := c.List(); len(got) != 0 {
		t.Errorf("List after a mismatch = %+v", got)
	}
	if rec := get(t, c.Handler(), http.MethodGet, "/images/"+d); rec.Code != http.StatusNotFound {
		t.Errorf("GET after a mismatch: %d", rec.Code)
	}
	for _, sub := range []string{"blobs", "meta", "tmp"} {
		if des, _ := os.ReadDir(filepath.Join(dir, sub)); len(des) != 0 {
			t.Errorf("%s/ holds %d files after a mismatch", sub, len(des))
		}
	}

	// The right bytes later pull fine.
	o.put("/initrd", want)
	if err := c.Pull(context.Background(), d, src); err != nil {
		t.Fatalf("Pull of the right bytes: %v", err)
	}
}

func TestPullRefuses(t *testing.T) {
	o := newOrigin(t)
	good := []byte("x")
	d := digestOf(good)
	o.put("/x", good)
	c, _ := newCache(t, o, 0)
	for _, tc := range []struct {
		name, digest, src, want string
	}{
		{"http source", d, strings.Replace(o.srv.URL, "https", "http", 1) + "/x", "https"},
		{"upper-case digest", strings.ToUpper(d), o.srv.URL + "/x", "hex"},
		{"short digest", d[:63], o.srv.URL + "/x", "hex"},
		{"404", digestOf([]byte("nothing")), o.srv.URL + "/nothing", "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Pull(context.Background(), tc.digest, tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Pull: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestTooLargeForTheCache(t *testing.T) {
	o := newOrigin(t)
	big := bytes.Repeat([]byte{1}, 4096)
	src := o.put("/big", big)
	c, _ := newCache(t, o, 1024)
	if err := c.Pull(context.Background(), digestOf(big), src); err == nil || !strings.Contains(err.Error(), "more than the cache") {
		t.Fatalf("Pull: %v", err)
	}
	if got := c.List(); len(got) != 0 {
		t.Errorf("List = %+v", got)
	}
}

func TestEvictionKeepsNamedImages(t *testing.T) {
	o := newOrigin(t)
	img := func(name string) ([]byte, string, string) {
		b := bytes.Repeat([]byte(name), 100) // 100 bytes per 1-byte name
		return b, digestOf(b), o.put("/"+name, b)
	}
	_, da, sa := img("a")
	_, db, sb := img("b")
	_, dc, sc := img("c")
	_, dd, sd := img("d")
	c, _ := newCache(t, o, 300)
	ctx := context.Background()

	if err := c.SetKeep([]string{da}); err != nil {
		t.Fatal(err)
	}
	for _, p := range [][2]string{{da, sa}, {db, sb}, {dc, sc}} {
		if err := c.Pull(ctx, p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	// b is used, so c is now the least recently used unkept image; a is
	// the oldest of all but kept.
	f, err := c.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := c.Pull(ctx, dd, sd); err != nil {
		t.Fatal(err)
	}
	ready := map[string]bool{}
	for _, img := range c.List() {
		ready[img.Digest] = img.State == StateReady
	}
	if !ready[da] || !ready[db] || !ready[dd] || ready[dc] {
		t.Errorf("after eviction a=%v b=%v c=%v d=%v, want a, b and d kept and c evicted", ready[da], ready[db], ready[dc], ready[dd])
	}
	if _, err := c.Open(dc); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open of the evicted image: %v", err)
	}

	// Keeping everything leaves the cache above its bound rather than
	// evicting a kept image.
	if err := c.SetKeep([]string{da, db, dc, dd}); err != nil {
		t.Fatal(err)
	}
	if err := c.Pull(ctx, dc, sc); err != nil {
		t.Fatal(err)
	}
	evicted, err := c.Trim()
	if err != nil {
		t.Fatal(err)
	}
	if len(evicted) != 0 {
		t.Errorf("Trim evicted %v", evicted)
	}
	if len(c.List()) != 4 {
		t.Errorf("List has %d images, want 4", len(c.List()))
	}
	// Dropping c and d from the keep set evicts d, the less recently
	// used of the two, and that is enough.
	if err := c.SetKeep([]string{da, db}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Open(dd); !errors.Is(err, ErrNotFound) {
		t.Errorf("d still cached after leaving the keep set: %v", err)
	}
	if len(c.List()) != 3 {
		t.Errorf("List has %d images, want 3", len(c.List()))
	}
}

func TestConcurrentPullsDownloadOnce(t *testing.T) {
	o := newOrigin(t)
	b := bytes.Repeat([]byte("os image "), 10000)
	d := digestOf(b)
	src := o.put("/os.img", b)
	o.gate = make(chan struct{})
	c, _ := newCache(t, o, 0)

	const n = 8
	errs := make(chan error, n)
	go func() { errs <- c.Pull(context.Background(), d, src) }()
	select {
	case <-o.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first pull never reached the origin")
	}
	if got := c.List(); len(got) != 1 || got[0].State != StatePulling {
		t.Errorf("List while pulling = %+v", got)
	}
	if _, err := c.Open(d); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open while pulling: %v, want ErrNotFound", err)
	}
	for range n - 1 {
		go func() { errs <- c.Pull(context.Background(), d, src) }()
	}
	// Give the waiters time to join before the download finishes; a late
	// one finds the image ready, which downloads nothing either.
	time.Sleep(100 * time.Millisecond)
	close(o.gate)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Pull: %v", err)
		}
	}
	if got := o.count("/os.img"); got != 1 {
		t.Errorf("origin hit %d times, want 1", got)
	}
}

func TestCancelledWaiter(t *testing.T) {
	o := newOrigin(t)
	b := []byte("slow")
	d := digestOf(b)
	src := o.put("/slow", b)
	o.gate = make(chan struct{})
	c, _ := newCache(t, o, 0)
	first := make(chan error, 1)
	go func() { first <- c.Pull(context.Background(), d, src) }()
	<-o.started
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Pull(ctx, d, src); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled waiter: %v", err)
	}
	close(o.gate)
	if err := <-first; err != nil {
		t.Errorf("first pull: %v", err)
	}
}

func TestHandlerRefusesBadPaths(t *testing.T) {
	o := newOrigin(t)
	b := []byte("served")
	d := digestOf(b)
	src := o.put("/s", b)
	c, dir := newCache(t, o, 0)
	if err := c.Pull(context.Background(), d, src); err != nil {
		t.Fatal(err)
	}
	// A file beside the cache that a climbing path would reach.
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := c.Handler()
	for _, p := range []string{
		"/images/" + d + "/",
		"/images/" + strings.ToUpper(d),
		"/images/" + d[:63],
		"/images/" + d + "0",
		"/images/../secret",
		"/images/..%2fsecret",
		"/images/%2e%2e/secret",
		"/images/../../etc/passwd",
		"/images/" + d[:62] + "%61%61",
		"/images/",
		"/images",
		"/" + d,
		"/blobs/" + d,
		"/images/" + digestOf([]byte("not cached")),
	} {
		if rec := get(t, h, http.MethodGet, p); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, rec.Code)
		}
	}
	if rec := get(t, h, http.MethodPost, "/images/"+d); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
	if rec := get(t, h, http.MethodHead, "/images/"+d); rec.Code != http.StatusOK {
		t.Errorf("HEAD: %d, want 200", rec.Code)
	}
}

func TestNewCleansLeftovers(t *testing.T) {
	dir := t.TempDir()
	for _, sub := range []string{"tmp", "blobs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "tmp", "partial"), []byte("half"), 0o600)
	os.WriteFile(filepath.Join(dir, "blobs", "not-a-digest"), []byte("x"), 0o600)
	c, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if des, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(des) != 0 {
		t.Errorf("tmp/ still holds %d files", len(des))
	}
	if got := c.List(); len(got) != 0 {
		t.Errorf("List = %+v", got)
	}
}
