package update

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/trust/release"
)

// BenchmarkDownload: a release binary fetched over loopback HTTP into
// staging with its size and SHA-256 checked while it is written (what
// daemon.upgrade does), next to a plain copy of the same file over the
// same server into the same directory (no checks), same run.
func BenchmarkDownload(b *testing.B) {
	const size = 64 << 20
	dir := b.TempDir()
	src := filepath.Join(dir, "bcd-release")
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(data)
	a := release.Artifact{Role: "node", Arch: "amd64", Size: size, SHA256: hex.EncodeToString(sum[:])}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, src) }))
	defer srv.Close()
	get := func() io.ReadCloser {
		resp, err := http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		return resp.Body
	}
	staging := filepath.Join(dir, "staging")
	b.Run("verified", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			ag := &Agent{StagingDir: staging}
			r, err := ag.get(context.Background(), srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := Download(r, staging, "0.2.0", a); err != nil {
				b.Fatal(err)
			}
			r.Close()
			os.Remove(filepath.Join(staging, StagedName("0.2.0")))
		}
	})
	b.Run("plain-copy", func(b *testing.B) {
		b.SetBytes(size)
		for range b.N {
			r := get()
			f, err := os.OpenFile(filepath.Join(staging, "plain"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(f, r); err != nil {
				b.Fatal(err)
			}
			f.Sync()
			f.Close()
			r.Close()
			os.Remove(f.Name())
		}
	})
}
