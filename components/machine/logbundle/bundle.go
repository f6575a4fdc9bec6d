// Package logbundle builds the bundle of the logs.collect command and
// uploads it to the presigned https URL the command names.
//
// A bundle is a tar.gz with one file per Source, each passed through
// Redact (join tokens, JWTs, private keys, URL passwords, Authorization
// values and secret-named config values removed), and a manifest.json
// listing each file's name, size, SHA-256 and the error that source met: a
// failing source is recorded, never fatal. Build writes the bundle, capped
// at a total size; Upload PUTs it; Collect does both through a temporary
// file and returns the size and SHA-256 the command's result reports.
// Presigned URLs carry credentials in their query, so no error or log line
// of this package holds one: RedactURL is what to log.
package logbundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
)

// ManifestName is the manifest's name in the bundle; no source may use it.
const ManifestName = "manifest.json"

// Source is one file of the bundle. Read returns its content; when it
// also returns an error, the error is recorded in the manifest and
// whatever content came with it is kept.
type Source struct {
	// Name is the file's name in the bundle: a relative slash-separated
	// path without "..", such as "config.toml" or "journal/bcd.txt".
	Name string
	Read func(ctx context.Context) ([]byte, error)
	// Tail keeps the end of the content rather than its start when the
	// bundle's size cap truncates it (logs, whose latest lines matter).
	Tail bool
}

// ManifestEntry describes one source in manifest.json.
type ManifestEntry struct {
	Name string `json:"name"`
	// Size and SHA256 are those of the file as stored in the bundle
	// (redacted, maybe truncated); zero and empty when nothing was stored.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// Error is why the source failed, redacted.
	Error string `json:"error,omitempty"`
	// Truncated is set when the size cap cut the file; OriginalSize is
	// then its redacted size before the cut.
	Truncated    bool  `json:"truncated,omitempty"`
	OriginalSize int64 `json:"original_size,omitempty"`
}

// Manifest is manifest.json, the bundle's last file.
type Manifest struct {
	Created  time.Time       `json:"created"`
	MaxBytes int64           `json:"max_bytes,omitempty"`
	Files    []ManifestEntry `json:"files"`
}

// Build reads each source in turn, redacts its content and writes it to w
// as one file of a tar.gz, then writes manifest.json. The files' content
// together is capped at maxBytes (no cap when maxBytes <= 0): the source
// that crosses the cap is truncated at a line break, with a note in the
// file when room remains for it, and the sources after it are stored
// empty, each marked truncated. Build fails only when writing to w fails
// or ctx ends; the manifest is returned either way.
func Build(ctx context.Context, sources []Source, w io.Writer, maxBytes int64) (Manifest, error) {
	m := Manifest{Created: time.Now().UTC().Truncate(time.Second), MaxBytes: max(maxBytes, 0), Files: []ManifestEntry{}}
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	r := newRedactor()
	seen := map[string]bool{ManifestName: true}
	remaining := maxBytes
	for _, src := range sources {
		if err := ctx.Err(); err != nil {
			return m, fmt.Errorf("building the log bundle: %w", err)
		}
		entry := ManifestEntry{Name: src.Name}
		name, err := checkName(src.Name)
		switch {
		case err != nil:
			entry.Error = err.Error()
		case seen[name]:
			entry.Error = fmt.Sprintf("another source is already named %q", name)
		case src.Read == nil:
			entry.Error = "the source has no reader"
		}
		if entry.Error != "" {
			m.Files = append(m.Files, entry)
			continue
		}
		seen[name] = true
		entry.Name = name

		data, err := src.Read(ctx)
		if err != nil {
			entry.Error = string(r.redact([]byte(err.Error())))
			if ctx.Err() != nil {
				m.Files = append(m.Files, entry)
				return m, fmt.Errorf("building the log bundle: reading %s: %w", name, ctx.Err())
			}
		}
		if err != nil && len(data) == 0 {
			m.Files = append(m.Files, entry)
			continue
		}
		data = r.redact(data)
		if maxBytes > 0 && int64(len(data)) > remaining {
			entry.Truncated, entry.OriginalSize = true, int64(len(data))
			data = truncate(data, remaining, src.Tail)
		}
		remaining -= int64(len(data))
		sum := sha256.Sum256(data)
		entry.Size, entry.SHA256 = int64(len(data)), hex.EncodeToString(sum[:])
		if err := writeFile(tw, name, data, m.Created); err != nil {
			return m, err
		}
		m.Files = append(m.Files, entry)
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, fmt.Errorf("encoding %s: %w", ManifestName, err)
	}
	if err := writeFile(tw, ManifestName, append(raw, '\n'), m.Created); err != nil {
		return m, err
	}
	if err := tw.Close(); err != nil {
		return m, fmt.Errorf("closing the log bundle's tar stream: %w", err)
	}
	if err := gz.Close(); err != nil {
		return m, fmt.Errorf("closing the log bundle's gzip stream: %w", err)
	}
	return m, nil
}

// checkName cleans a source name and refuses one that would leave the
// bundle's directory or name the manifest.
func checkName(name string) (string, error) {
	clean := path.Clean(name)
	if name == "" || clean == "." || path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.ContainsAny(clean, "\\\x00") {
		return "", fmt.Errorf("invalid file name %q (a relative slash-separated path without ..)", name)
	}
	if clean == ManifestName {
		return "", fmt.Errorf("invalid file name %q (reserved for the manifest)", name)
	}
	return clean, nil
}

func writeFile(tw *tar.Writer, name string, data []byte, mod time.Time) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: mod}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing the log bundle's header for %s: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("writing %s to the log bundle: %w", name, err)
	}
	return nil
}

// truncate cuts data to at most room bytes, keeping its start (or its end
// with tail) and cutting at a line break when the part kept has one. A
// note saying how much was dropped goes where the cut is when it fits.
func truncate(data []byte, room int64, tail bool) []byte {
	if room <= 0 {
		return nil
	}
	if int64(len(data)) <= room {
		return data
	}
	note := func(kept int) []byte {
		return fmt.Appendf(nil, "[bcd: the bundle's size cap dropped %d of %d bytes]\n", len(data)-kept, len(data))
	}
	// No note is longer than the one for nothing kept, plus a line break.
	keep := int(room) - len(note(0)) - 1
	if keep <= 0 {
		if tail {
			return bytes.Clone(data[len(data)-int(room):])
		}
		return bytes.Clone(data[:room])
	}
	if tail {
		part := data[len(data)-keep:]
		if i := bytes.IndexByte(part, '\n'); i >= 0 {
			part = part[i+1:]
		}
		return append(note(len(part)), part...)
	}
	part := data[:keep]
	if i := bytes.LastIndexByte(part, '\n'); i >= 0 {
		part = part[:i+1]
	}
	out := bytes.Clone(part)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, note(len(part))...)
}
