package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/qcow2"
)

// The archive's members, in this order: the manifest, the disk, and with
// a memory snapshot the saved memory.
const (
	ManifestFile = "snapshot.json"
	DiskFile     = "disk.qcow2"
	MemoryFile   = "memory.save"
)

// MaxManifest bounds snapshot.json.
const MaxManifest = 64 << 10

// Manifest is snapshot.json: what the snapshot was taken of, so a
// restore can refuse a memory snapshot into another shape or CPU with a
// clear reason before QEMU tries it.
type Manifest struct {
	Version   int       `json:"version"`
	Instance  string    `json:"instance"`
	VCPUs     int       `json:"vcpus"`
	MemoryMiB int       `json:"memory_mib"`
	Memory    bool      `json:"memory"`
	CPU       string    `json:"cpu"`
	Created   time.Time `json:"created"`
}

// member is one file of an archive to write.
type member struct {
	name string
	path string
}

// WriteArchive writes a snapshot archive of m, the disk at disk and,
// when memory is not "", the saved memory at memory, to path (0600), and
// returns its size and SHA-256.
func WriteArchive(path string, m Manifest, disk, memory string) (int64, string, error) {
	members := []member{{DiskFile, disk}}
	if memory != "" {
		members = append(members, member{MemoryFile, memory})
	}
	return writeArchive(path, m, members)
}

// writeArchive writes the manifest and members as an uncompressed tar
// to path (0600), and returns its size and SHA-256.
func writeArchive(path string, m Manifest, members []member) (int64, string, error) {
	mb, err := json.Marshal(m)
	if err != nil {
		return 0, "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	tw := tar.NewWriter(cw)
	add := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, ModTime: m.Created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	if err := add(ManifestFile, int64(len(mb)), bytes.NewReader(mb)); err != nil {
		return 0, "", fmt.Errorf("writing the snapshot archive: %w", err)
	}
	for _, x := range members {
		in, err := os.Open(x.path)
		if err != nil {
			return 0, "", err
		}
		st, err := in.Stat()
		if err == nil {
			err = add(x.name, st.Size(), in)
		}
		in.Close()
		if err != nil {
			return 0, "", fmt.Errorf("writing %s into the snapshot archive: %w", x.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return 0, "", err
	}
	if err := f.Sync(); err != nil {
		return 0, "", err
	}
	return cw.n, hex.EncodeToString(h.Sum(nil)), nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ErrRefused is a snapshot archive that arrived whole and failed its
// checks: fetching it again will not mend it.
var ErrRefused = errors.New("snapshot refused")

// Unpack reads a fetched archive (its SHA-256 already checked) into dir:
// exactly the manifest, then the disk, then with a memory snapshot the
// memory, each a regular file once; the manifest decoded strictly; the
// disk a qcow2 naming no backing file, no data file, no encryption (the
// checks of a base image). The members go into a temporary directory
// renamed to dir only when all passed (files 0640, for QEMU through the
// node's group); a refusal leaves nothing and wraps ErrRefused.
func Unpack(archive, dir string) (Manifest, error) {
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	m, err := unpack(archive, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return m, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return m, err
	}
	return m, nil
}

func unpack(archive, tmp string) (Manifest, error) {
	var m Manifest
	f, err := os.Open(archive)
	if err != nil {
		return m, err
	}
	defer f.Close()
	if err := os.MkdirAll(tmp, 0o750); err != nil {
		return m, err
	}
	tr := tar.NewReader(f)
	want := []string{ManifestFile, DiskFile, MemoryFile}
	for i := 0; ; i++ {
		h, err := tr.Next()
		if err == io.EOF {
			if i < 2 {
				return m, fmt.Errorf("%w: the archive has %d members; a snapshot has its manifest and disk", ErrRefused, i)
			}
			break
		}
		if err != nil {
			return m, fmt.Errorf("%w: reading the archive: %v", ErrRefused, err)
		}
		if i >= len(want) || h.Name != want[i] || h.Typeflag != tar.TypeReg {
			return m, fmt.Errorf("%w: member %d is %q (type %q); a snapshot has %s, %s and optionally %s, in order, as regular files",
				ErrRefused, i+1, clip(h.Name), h.Typeflag, ManifestFile, DiskFile, MemoryFile)
		}
		if i == 0 {
			if m, err = readManifest(io.LimitReader(tr, MaxManifest+1)); err != nil {
				return m, err
			}
			b, _ := json.Marshal(m)
			if err := os.WriteFile(filepath.Join(tmp, ManifestFile), b, 0o640); err != nil {
				return m, err
			}
			continue
		}
		out, err := os.OpenFile(filepath.Join(tmp, h.Name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
		if err != nil {
			return m, err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return m, fmt.Errorf("%w: reading %s: %v", ErrRefused, h.Name, err)
		}
	}
	_, statErr := os.Lstat(filepath.Join(tmp, MemoryFile))
	if hasMem := statErr == nil; hasMem != m.Memory {
		return m, fmt.Errorf("%w: the manifest says memory %v, the archive has a memory member: %v", ErrRefused, m.Memory, hasMem)
	}
	if _, err := qcow2.CheckFile(filepath.Join(tmp, DiskFile), qcow2.Backing{}); err != nil {
		if inner := errors.Unwrap(err); inner != nil {
			err = inner
		}
		return m, fmt.Errorf("%w: its disk as a base image: %v", ErrRefused, err)
	}
	return m, nil
}

// ReadManifest reads the manifest of a snapshot Unpack made in dir.
func ReadManifest(dir string) (Manifest, error) {
	f, err := os.Open(filepath.Join(dir, ManifestFile))
	if err != nil {
		return Manifest{}, err
	}
	defer f.Close()
	return readManifest(io.LimitReader(f, MaxManifest+1))
}

// readManifest decodes snapshot.json strictly.
func readManifest(r io.Reader) (Manifest, error) {
	var m Manifest
	b, err := io.ReadAll(r)
	if err != nil {
		return m, fmt.Errorf("%w: reading %s: %v", ErrRefused, ManifestFile, err)
	}
	if len(b) > MaxManifest {
		return m, fmt.Errorf("%w: %s is larger than %d bytes", ErrRefused, ManifestFile, MaxManifest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrRefused, ManifestFile, err)
	}
	if dec.More() {
		return m, fmt.Errorf("%w: %s: data after the JSON value", ErrRefused, ManifestFile)
	}
	switch {
	case m.Version != 1:
		return m, fmt.Errorf("%w: %s version %d; this bcd reads 1", ErrRefused, ManifestFile, m.Version)
	case !domainxml.ValidID(m.Instance):
		return m, fmt.Errorf("%w: %s: instance %q is not an instance id", ErrRefused, ManifestFile, clip(m.Instance))
	case m.VCPUs < 1 || m.VCPUs > domainxml.MaxVCPUs || m.MemoryMiB < domainxml.MinMemoryMiB || m.MemoryMiB > domainxml.MaxMemoryMiB:
		return m, fmt.Errorf("%w: %s: %d vCPUs and %d MiB are out of bounds", ErrRefused, ManifestFile, m.VCPUs, m.MemoryMiB)
	case len(m.CPU) > 256:
		return m, fmt.Errorf("%w: %s: cpu is longer than 256 bytes", ErrRefused, ManifestFile)
	}
	return m, nil
}

// Fits says why a memory snapshot of m cannot resume into an instance of
// vcpus and memoryMiB on a host whose CPU is cpu ("" when it can).
func (m Manifest) Fits(vcpus, memoryMiB int, cpu string) string {
	switch {
	case !m.Memory:
		return "the snapshot has no memory (it was taken without memory: true)"
	case m.VCPUs != vcpus || m.MemoryMiB != memoryMiB:
		return fmt.Sprintf("a memory snapshot of %d vCPUs and %d MiB resumes only into the same shape, not %d vCPUs and %d MiB", m.VCPUs, m.MemoryMiB, vcpus, memoryMiB)
	case m.CPU != cpu:
		return fmt.Sprintf("a memory snapshot taken on CPU %q resumes only on the same CPU model; this host's is %q", m.CPU, cpu)
	}
	return ""
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
