package images

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/spec"
)

// served is the test's image server: https on loopback, files by path,
// counting requests.
type served struct {
	*httptest.Server
	files    map[string][]byte
	requests atomic.Int64
}

func serve(t *testing.T) *served {
	s := &served{files: map[string][]byte{}}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if r.URL.Path == "/to-http" {
			http.Redirect(w, r, "http://"+r.Host+"/base.qcow2", http.StatusFound)
			return
		}
		b, ok := s.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

// qcow2Image makes a qcow2 image with qemu-img create args.
func qcow2Image(t *testing.T, args ...string) []byte {
	t.Helper()
	bin := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	p := filepath.Join(t.TempDir(), "img.qcow2")
	if out, err := exec.Command(bin, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), p)...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// store opens a store whose "system roots" are the test server's.
func store(t *testing.T, srv *served) (*Store, string) {
	dir := filepath.Join(t.TempDir(), "images")
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	s, err := New(Config{Dir: dir, Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

// files lists dir and its tmp/, for "nothing left behind".
func files(t *testing.T, dir string) []string {
	var out []string
	for _, d := range []string{dir, filepath.Join(dir, "tmp")} {
		es, _ := os.ReadDir(d)
		for _, e := range es {
			if e.Name() != "tmp" {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

func TestFetch(t *testing.T) {
	srv := serve(t)
	base := qcow2Image(t, "-o", "size=64M")
	shadow := qcow2Image(t, "-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M")
	srv.files["/base.qcow2"] = base
	srv.files["/shadow.qcow2"] = shadow
	srv.files["/shadow.raw"] = shadow
	srv.files["/disk.raw"] = []byte("raw bytes")
	pin := pki.PinOfCert(srv.Certificate())
	otherPin := "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	for _, tt := range []struct {
		name     string
		im       spec.Image
		noRoots  bool
		refused  bool
		wantErr  string
		requests int64
	}{
		{name: "qcow2 through roots", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/base.qcow2", Format: "qcow2"}, requests: 1},
		{name: "qcow2 through pin", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/base.qcow2", Format: "qcow2", SPKIPin: pin}, noRoots: true, requests: 1},
		{name: "other pin", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/base.qcow2", Format: "qcow2", SPKIPin: otherPin}, wantErr: "does not chain to spki_pin"},
		{name: "untrusted server", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/base.qcow2", Format: "qcow2"}, noRoots: true, wantErr: "certificate"},
		{name: "digest differs", im: spec.Image{SHA256: sum([]byte("other")), URL: srv.URL + "/base.qcow2?sig=s3cr3t", Format: "qcow2"}, wantErr: "not " + sum([]byte("other")), requests: 1, refused: true},
		{name: "backing /etc/shadow", im: spec.Image{SHA256: sum(shadow), URL: srv.URL + "/shadow.qcow2", Format: "qcow2"}, wantErr: `backing file ("/etc/shadow")`, requests: 1, refused: true},
		{name: "raw never probed", im: spec.Image{SHA256: sum(shadow), URL: srv.URL + "/shadow.raw", Format: "raw"}, requests: 1},
		{name: "http", im: spec.Image{SHA256: sum(base), URL: strings.Replace(srv.URL, "https", "http", 1) + "/base.qcow2", Format: "qcow2"}, wantErr: "https://"},
		{name: "redirect to http", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/to-http", Format: "qcow2"}, wantErr: "redirect to http refused", requests: 1},
		{name: "not found", im: spec.Image{SHA256: sum(base), URL: srv.URL + "/none?sig=s3cr3t", Format: "qcow2"}, wantErr: "404", requests: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, dir := store(t, srv)
			if tt.noRoots {
				s.cfg.Roots = x509.NewCertPool()
			}
			before := srv.requests.Load()
			err := s.Fetch(context.Background(), tt.im)
			if got := srv.requests.Load() - before; got != tt.requests {
				t.Errorf("%d requests, want %d", got, tt.requests)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Fetch = %v, want %q", err, tt.wantErr)
				}
				if errors.Is(err, ErrRefused) != tt.refused {
					t.Errorf("Fetch = %v: refused %v, want %v", err, !tt.refused, tt.refused)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("the error carries the URL's query: %v", err)
				}
				if l := files(t, dir); len(l) != 0 {
					t.Errorf("a refused fetch left %v", l)
				}
				if _, err := s.Ready(tt.im); err == nil {
					t.Error("Ready after a refused fetch")
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch = %v", err)
			}
			b, err := s.Ready(tt.im)
			p := b.Path
			if err != nil || p != filepath.Join(dir, tt.im.SHA256+"."+tt.im.Format) {
				t.Fatalf("Ready = %+v, %v", b, err)
			}
			if want := int64(len(srv.files[strings.TrimPrefix(tt.im.URL, srv.URL)])); tt.im.Format == "qcow2" && b.VirtualSize != 64<<20 || tt.im.Format == "raw" && b.VirtualSize != want {
				t.Errorf("virtual size %d", b.VirtualSize)
			}
			if st, _ := os.Stat(p); st.Mode().Perm() != 0o640 {
				t.Errorf("image mode %v, want 0640", st.Mode().Perm())
			}
			if err := s.Fetch(context.Background(), tt.im); err != nil || srv.requests.Load()-before != tt.requests {
				t.Errorf("a second Fetch = %v after %d requests; want none more", err, srv.requests.Load()-before)
			}
		})
	}
}

// TestReadyRechecks: a base image changed on disk after its fetch (the
// node owns the file) is refused before use.
func TestReadyRechecks(t *testing.T) {
	srv := serve(t)
	base := qcow2Image(t, "-o", "size=64M")
	srv.files["/base.qcow2"] = base
	s, _ := store(t, srv)
	im := spec.Image{SHA256: sum(base), URL: srv.URL + "/base.qcow2", Format: "qcow2"}
	if err := s.Fetch(context.Background(), im); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path(im), qcow2Image(t, "-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ready(im); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "/etc/shadow") {
		t.Errorf("Ready = %v, want the backing file refused", err)
	}
}

// TestKeep: an image stays while named and goes once not.
func TestKeep(t *testing.T) {
	srv := serve(t)
	srv.files["/a.raw"], srv.files["/b.iso"] = []byte("a"), []byte("b")
	s, dir := store(t, srv)
	a := spec.Image{SHA256: sum([]byte("a")), URL: srv.URL + "/a.raw", Format: "raw"}
	b := spec.Image{SHA256: sum([]byte("b")), URL: srv.URL + "/b.iso", Format: "iso"}
	for _, im := range []spec.Image{a, b} {
		if err := s.Fetch(context.Background(), im); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := s.Keep([]string{a.SHA256})
	if err != nil || !slices.Equal(removed, []string{b.SHA256 + ".iso"}) {
		t.Errorf("Keep = %v, %v; want b removed", removed, err)
	}
	if l := files(t, dir); !slices.Equal(l, []string{a.SHA256 + ".raw"}) {
		t.Errorf("left %v, want a alone", l)
	}
	if removed, err := s.Keep(nil); err != nil || len(removed) != 1 {
		t.Errorf("Keep(nil) = %v, %v; want a removed", removed, err)
	}
}
