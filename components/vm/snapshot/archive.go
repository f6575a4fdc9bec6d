package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
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
