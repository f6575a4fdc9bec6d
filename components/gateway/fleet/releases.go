package fleet

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
	"sort"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/release"
)

// ReleasesDir, in the gateway's data directory, holds the published
// releases: <version>.json, the signed document as published, and
// artifacts/<sha256>, the binaries the gateway serves.
const ReleasesDir = "releases"

var (
	SHA256Pattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
	versionRe     = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?$`)
)

// MaxReleaseArtifact bounds one uploaded release binary.
const MaxReleaseArtifact = 1 << 30

func (s *Fleet) releasesDir() string { return filepath.Join(s.cfg.DataDir, ReleasesDir) }

// UploadArtifact stores a release binary the admin API received under
// releases/uploads/<sum>, hashing what it writes: a body whose SHA-256 is
// not sum, or longer than MaxReleaseArtifact, is refused and nothing is
// kept. PublishRelease takes it from there.
func (s *Fleet) UploadArtifact(sum string, r io.Reader) (int64, error) {
	if !SHA256Pattern.MatchString(sum) {
		return 0, fmt.Errorf("%q is not a SHA-256 in hex", sum)
	}
	dir := filepath.Join(s.releasesDir(), "uploads")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, err
	}
	n, err := writeVerified(io.LimitReader(r, MaxReleaseArtifact+1), filepath.Join(dir, sum), sum)
	if err == nil && n > MaxReleaseArtifact {
		os.Remove(filepath.Join(dir, sum))
		err = fmt.Errorf("the binary is larger than %d bytes", MaxReleaseArtifact)
	}
	return n, err
}

// PublishRelease stores a signed release document and the binaries
// uploaded for it. Each upload must be one of the manifest's artifacts
// (same size and SHA-256), and each artifact whose URL is this gateway's
// ReleasePath must have its binary (uploaded now, or published before).
// The gateway does not hold the release keys, so it checks the document's
// form, not its signatures: nodes verify those. A version published
// before can only be published again with the same document. With a
// database shared by several gateways the release goes into it, so each
// of them serves it; the data directory keeps a copy either way.
func (s *Fleet) PublishRelease(doc []byte, uploads []string) (adminapi.Published, error) {
	_, m, err := release.Decode(doc)
	if err != nil {
		return adminapi.Published{}, err
	}
	if !versionRe.MatchString(m.Version) {
		return adminapi.Published{}, fmt.Errorf("version %q is not a release version", m.Version)
	}
	if old, err := s.ReleaseDoc(m.Version); err == nil && !bytes.Equal(old, doc) {
		return adminapi.Published{}, fmt.Errorf("release %s: %w", m.Version, store.ErrReleaseConflict)
	} else if err != nil && !errors.Is(err, store.ErrNotFound) {
		return adminapi.Published{}, err
	}
	dir := s.releasesDir()
	given := map[string]string{} // sha256 -> uploaded file
	for _, sum := range uploads {
		if !SHA256Pattern.MatchString(sum) {
			return adminapi.Published{}, fmt.Errorf("%q is not a SHA-256 in hex", sum)
		}
		f := filepath.Join(dir, "uploads", sum)
		fi, err := os.Stat(f)
		if err != nil {
			return adminapi.Published{}, fmt.Errorf("binary %s was not uploaded (PUT /v1/releases/uploads/%s)", sum, sum)
		}
		found := false
		for _, a := range m.Artifacts {
			if a.SHA256 == sum && a.Size == fi.Size() {
				found = true
			}
		}
		if !found {
			return adminapi.Published{}, fmt.Errorf("binary %s (%d bytes) is none of release %s's artifacts", sum, fi.Size(), m.Version)
		}
		given[sum] = f
	}
	p := adminapi.Published{Version: m.Version, Sequence: m.Sequence}
	local := map[string]string{} // binaries served here that were not uploaded now
	for _, a := range m.Artifacts {
		name := a.Role + "/" + a.Arch
		u, err := url.Parse(a.URL)
		here := err == nil && u.Path == adminapi.ReleasePath+a.SHA256
		_, ok := given[a.SHA256]
		if here && !ok {
			if f, err := s.Artifact(a.SHA256); err == nil {
				local[a.SHA256] = f.Name()
				f.Close()
				ok = true
			}
		}
		switch {
		case here && !ok:
			return adminapi.Published{}, fmt.Errorf("artifact %s is to be fetched from this gateway (%s) but no --artifact file is its binary", name, a.URL)
		case ok:
			p.Served = append(p.Served, name)
		default:
			p.Elsewhere = append(p.Elsewhere, name)
		}
	}
	if rs, ok := s.store.(store.Releases); ok {
		// Every binary served here goes to the database, the ones this
		// gateway kept from before it shared one included: the other
		// gateways serve the release too (stored once by its SHA-256).
		bins := map[string][]byte{}
		for sum, f := range local {
			given[sum] = f
		}
		for sum, f := range given {
			b, err := os.ReadFile(f)
			if err != nil {
				return adminapi.Published{}, err
			}
			if hexSHA256(b) != sum {
				return adminapi.Published{}, fmt.Errorf("uploaded binary %s changed on disk", sum)
			}
			bins[sum] = b
		}
		if err := rs.PutRelease(m.Version, doc, bins); err != nil {
			return adminapi.Published{}, err
		}
		p.Shared = true
	}
	if err := os.MkdirAll(filepath.Join(dir, "artifacts"), 0o700); err != nil {
		return adminapi.Published{}, err
	}
	for sum, f := range given {
		if _, kept := local[sum]; kept {
			continue
		}
		if err := os.Rename(f, filepath.Join(dir, "artifacts", sum)); err != nil {
			return adminapi.Published{}, err
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, m.Version+".json"), doc, 0o600); err != nil {
		return adminapi.Published{}, err
	}
	return p, nil
}

// ReleaseDoc returns the published document of version: this gateway's
// copy, or the database's (store.ErrNotFound when neither has it).
func (s *Fleet) ReleaseDoc(version string) ([]byte, error) {
	if !versionRe.MatchString(version) {
		return nil, fmt.Errorf("%q is not a release version", version)
	}
	b, err := os.ReadFile(filepath.Join(s.releasesDir(), version+".json"))
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return b, err
	}
	if rs, ok := s.store.(store.Releases); ok {
		return rs.Release(version)
	}
	return nil, store.ErrNotFound
}

// Artifact opens the published binary whose SHA-256 is sum: this
// gateway's copy, or else the database's, checked against sum and kept
// as this gateway's copy.
func (s *Fleet) Artifact(sum string) (*os.File, error) {
	path := filepath.Join(s.releasesDir(), "artifacts", sum)
	f, err := os.Open(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return f, err
	}
	rs, ok := s.store.(store.Releases)
	if !ok {
		return nil, err
	}
	b, err := rs.ReleaseArtifact(sum)
	if err != nil {
		return nil, err
	}
	if hexSHA256(b) != sum {
		return nil, fmt.Errorf("the database's release binary %s has another SHA-256", sum)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		return nil, err
	}
	return os.Open(path)
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// writeVerified writes r to dst through a temporary file renamed into
// place, hashing what it writes: what does not hash to sum is refused and
// nothing is kept.
func writeVerified(r io.Reader, dst, sum string) (int64, error) {
	tmp := dst + ".part"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), r)
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && hex.EncodeToString(h.Sum(nil)) != sum {
		err = fmt.Errorf("the binary's SHA-256 is %s, not %s", hex.EncodeToString(h.Sum(nil)), sum)
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return n, err
	}
	return n, nil
}

// Releases lists the published releases (this gateway's and the
// database's), by sequence.
func (s *Fleet) Releases() ([]adminapi.ReleaseView, error) {
	versions := map[string]bool{}
	ents, err := os.ReadDir(s.releasesDir())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		if v, ok := strings.CutSuffix(e.Name(), ".json"); ok && versionRe.MatchString(v) {
			versions[v] = true
		}
	}
	if rs, ok := s.store.(store.Releases); ok {
		vs, err := rs.ReleaseVersions()
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			versions[v] = true
		}
	}
	now := s.now()
	out := []adminapi.ReleaseView{}
	for v := range versions {
		doc, err := s.ReleaseDoc(v)
		if err != nil {
			return nil, err
		}
		_, m, err := release.Decode(doc)
		if err != nil {
			return nil, fmt.Errorf("published release %s: %w", v, err)
		}
		rv := adminapi.ReleaseView{Version: m.Version, Sequence: m.Sequence, Expires: m.Expires, Expired: !now.Before(m.Expires), Artifacts: []string{}}
		for _, a := range m.Artifacts {
			rv.Artifacts = append(rv.Artifacts, a.Role+"/"+a.Arch)
		}
		out = append(out, rv)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Sequence != out[j].Sequence {
			return out[i].Sequence < out[j].Sequence
		}
		return out[i].Version < out[j].Version
	})
	return out, nil
}

// ServeRelease answers GET /releases/<sha256> with a published binary.
func (s *Fleet) ServeRelease(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if !SHA256Pattern.MatchString(sum) {
		http.NotFound(w, r)
		return
	}
	f, err := s.Artifact(sum)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("release binary", "sha256", sum, "err", err)
		}
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
