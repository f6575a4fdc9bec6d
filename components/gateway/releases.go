package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/trust/release"
)

// ReleasesDir, in the gateway's data directory, holds the published
// releases: <version>.json, the signed document as published, and
// artifacts/<sha256>, the binaries the gateway serves.
const ReleasesDir = "releases"

// ReleasePath is where the gateway serves a published binary, by its
// SHA-256: a manifest's artifact URL https://<gateway>/releases/<sha256>
// is answered by this gateway (no client certificate needed: the bytes
// are checked against the signed manifest by whoever fetches them).
const ReleasePath = "/releases/"

var (
	sha256Re  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	versionRe = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?$`)
)

// Published is what PublishRelease stored.
type Published struct {
	Version  string `json:"version"`
	Sequence uint64 `json:"sequence"`
	// Served are the artifacts this gateway serves (role/arch), and
	// Elsewhere the ones whose URLs point elsewhere.
	Served    []string `json:"served"`
	Elsewhere []string `json:"elsewhere,omitempty"`
}

// PublishRelease stores a signed release document and the binaries
// given for its artifacts in dataDir. Each file must be one of the
// manifest's artifacts (same size and SHA-256), and each artifact whose
// URL is this gateway's ReleasePath must have its file. The gateway does
// not hold the release keys, so it checks the document's form, not its
// signatures: nodes verify those. A version published before can only be
// published again with the same document.
func PublishRelease(dataDir string, doc []byte, files []string) (Published, error) {
	_, m, err := release.Decode(doc)
	if err != nil {
		return Published{}, err
	}
	if !versionRe.MatchString(m.Version) {
		return Published{}, fmt.Errorf("version %q is not a release version", m.Version)
	}
	dir := filepath.Join(dataDir, ReleasesDir)
	docPath := filepath.Join(dir, m.Version+".json")
	if old, err := os.ReadFile(docPath); err == nil && !bytes.Equal(old, doc) {
		return Published{}, fmt.Errorf("release %s is already published with another document", m.Version)
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Published{}, err
	}
	// Hash each file and match it to an artifact.
	given := map[string]string{} // sha256 -> file
	for _, f := range files {
		sum, n, err := hashFile(f)
		if err != nil {
			return Published{}, err
		}
		found := false
		for _, a := range m.Artifacts {
			if a.SHA256 == sum && a.Size == n {
				found = true
			}
		}
		if !found {
			return Published{}, fmt.Errorf("%s (sha256 %s, %d bytes) is none of release %s's artifacts", f, sum, n, m.Version)
		}
		given[sum] = f
	}
	p := Published{Version: m.Version, Sequence: m.Sequence}
	for _, a := range m.Artifacts {
		name := a.Role + "/" + a.Arch
		u, err := url.Parse(a.URL)
		here := err == nil && u.Path == ReleasePath+a.SHA256
		_, ok := given[a.SHA256]
		switch {
		case here && !ok:
			return Published{}, fmt.Errorf("artifact %s is to be fetched from this gateway (%s) but no --artifact file is its binary", name, a.URL)
		case ok:
			p.Served = append(p.Served, name)
		default:
			p.Elsewhere = append(p.Elsewhere, name)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "artifacts"), 0o700); err != nil {
		return Published{}, err
	}
	for sum, f := range given {
		if err := copyVerified(f, filepath.Join(dir, "artifacts", sum), sum); err != nil {
			return Published{}, err
		}
	}
	if err := atomicfile.Write(docPath, doc, 0o600); err != nil {
		return Published{}, err
	}
	return p, nil
}

// PublishedRelease returns the published document of version.
func PublishedRelease(dataDir, version string) ([]byte, error) {
	if !versionRe.MatchString(version) {
		return nil, fmt.Errorf("%q is not a release version", version)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, ReleasesDir, version+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("release %s is not published here (bcgw release publish)", version)
	}
	return b, err
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("reading %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// copyVerified copies src to dst (through a temporary file renamed into
// place), hashing what it writes: a file that changed since it was
// matched is refused.
func copyVerified(src, dst, sum string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".part"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(out, h), in)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(h.Sum(nil)) != sum {
		err = fmt.Errorf("%s changed while it was published", src)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// serveRelease answers GET /releases/<sha256> with a published binary.
func (s *Server) serveRelease(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if !sha256Re.MatchString(sum) {
		http.NotFound(w, r)
		return
	}
	f, err := os.Open(filepath.Join(s.cfg.DataDir, ReleasesDir, "artifacts", sum))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}
