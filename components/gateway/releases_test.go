package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/release"
)

// TestPublishRelease: a release's binaries are stored by SHA-256 and
// served at /releases/<sha256>; a file that is none of its artifacts, an
// artifact to be served here without its file, and the same version with
// another document are refused and store nothing new.
func TestPublishRelease(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bcd-node")
	os.WriteFile(bin, []byte("bcd 0.2.0"), 0o755)
	other := filepath.Join(dir, "other")
	os.WriteFile(other, []byte("not bcd"), 0o755)
	sum := sha256.Sum256([]byte("bcd 0.2.0"))
	hexSum := hex.EncodeToString(sum[:])
	doc := func(url string, seq uint64) []byte {
		b, err := release.Encode(release.Manifest{Type: release.Type, Version: "0.2.0", Sequence: seq, Expires: time.Now().Add(time.Hour),
			Artifacts: []release.Artifact{{Role: "node", Arch: "amd64", Size: 9, SHA256: hexSum, URL: url}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	here := doc("https://gw.example:8443/releases/"+hexSum, 2)
	data := filepath.Join(dir, "gw")
	if _, err := PublishRelease(data, here, []string{other}); err == nil || !strings.Contains(err.Error(), "none of release 0.2.0's artifacts") {
		t.Errorf("another file: %v", err)
	}
	if _, err := PublishRelease(data, here, nil); err == nil || !strings.Contains(err.Error(), "no --artifact file is its binary") {
		t.Errorf("no file: %v", err)
	}
	if _, err := PublishedRelease(data, "0.2.0"); err == nil || !strings.Contains(err.Error(), "not published here") {
		t.Errorf("published after refusals: %v", err)
	}
	p, err := PublishRelease(data, here, []string{bin})
	if err != nil || len(p.Served) != 1 || p.Served[0] != "node/amd64" {
		t.Fatalf("PublishRelease = %+v, %v", p, err)
	}
	if _, err := PublishRelease(data, doc("https://gw.example:8443/releases/"+hexSum, 3), []string{bin}); err == nil || !strings.Contains(err.Error(), "already published with another document") {
		t.Errorf("republished: %v", err)
	}
	if b, err := PublishedRelease(data, "0.2.0"); err != nil || string(b) != string(here) {
		t.Errorf("PublishedRelease = %v", err)
	}
	s := &Server{cfg: Config{DataDir: data}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ReleasePath+"{sha256}", s.serveRelease)
	for path, want := range map[string]int{ReleasePath + hexSum: 200, ReleasePath + strings.Repeat("0", 64): 404, ReleasePath + "..%2f0.2.0.json": 404} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != want || want == 200 && w.Body.String() != "bcd 0.2.0" {
			t.Errorf("GET %s = %d %q, want %d", path, w.Code, w.Body.String(), want)
		}
	}
}
