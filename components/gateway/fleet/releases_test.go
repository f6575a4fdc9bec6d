package fleet

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/release"
)

// TestPublishRelease: a release's binaries are uploaded by SHA-256 and
// served at /releases/<sha256>; an upload that does not hash to its name,
// a binary that is none of its artifacts, an artifact to be served here
// without its binary, and the same version with another document are
// refused and store nothing new.
func TestPublishRelease(t *testing.T) {
	dir := t.TempDir()
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
	st, err := store.Open(filepath.Join(dir, "bcgw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Fleet{cfg: Config{DataDir: data}, store: st, log: slog.New(slog.DiscardHandler)}
	upload := func(b []byte, sum string) error {
		_, err := s.UploadArtifact(sum, bytes.NewReader(b))
		return err
	}
	otherSum := sha256.Sum256([]byte("not bcd"))
	if err := upload([]byte("bcd 0.2.0 changed"), hexSum); err == nil || !strings.Contains(err.Error(), "not "+hexSum) {
		t.Errorf("an upload that does not hash to its name: %v", err)
	}
	if err := upload([]byte("not bcd"), hex.EncodeToString(otherSum[:])); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PublishRelease(here, []string{hex.EncodeToString(otherSum[:])}); err == nil || !strings.Contains(err.Error(), "none of release 0.2.0's artifacts") {
		t.Errorf("another file: %v", err)
	}
	if _, err := s.PublishRelease(here, nil); err == nil || !strings.Contains(err.Error(), "no --artifact file is its binary") {
		t.Errorf("no file: %v", err)
	}
	if _, err := s.PublishRelease(here, []string{hexSum}); err == nil || !strings.Contains(err.Error(), "was not uploaded") {
		t.Errorf("not uploaded: %v", err)
	}
	if _, err := s.ReleaseDoc("0.2.0"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("published after refusals: %v", err)
	}
	if err := upload([]byte("bcd 0.2.0"), hexSum); err != nil {
		t.Fatal(err)
	}
	p, err := s.PublishRelease(here, []string{hexSum})
	if err != nil || len(p.Served) != 1 || p.Served[0] != "node/amd64" || p.Shared {
		t.Fatalf("PublishRelease = %+v, %v", p, err)
	}
	if _, err := s.PublishRelease(doc("https://gw.example:8443/releases/"+hexSum, 3), nil); !errors.Is(err, store.ErrReleaseConflict) {
		t.Errorf("republished: %v", err)
	}
	// The same document again needs no upload: the binary is here.
	if _, err := s.PublishRelease(here, nil); err != nil {
		t.Errorf("the same document again: %v", err)
	}
	if b, err := s.ReleaseDoc("0.2.0"); err != nil || string(b) != string(here) {
		t.Errorf("ReleaseDoc = %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.ReleasePath+"{sha256}", s.ServeRelease)
	for path, want := range map[string]int{adminapi.ReleasePath + hexSum: 200, adminapi.ReleasePath + strings.Repeat("0", 64): 404, adminapi.ReleasePath + "..%2f0.2.0.json": 404} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		if w.Code != want || want == 200 && w.Body.String() != "bcd 0.2.0" {
			t.Errorf("GET %s = %d %q, want %d", path, w.Code, w.Body.String(), want)
		}
	}
}
