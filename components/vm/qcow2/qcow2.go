// Package qcow2 reads a qcow2 image's header in Go, before any tool or
// QEMU opens the file, and refuses what would make QEMU open another
// file or hide the image's contents: a backing file other than the one
// the caller recorded, an external data file, encryption, an unknown
// incompatible feature, or a file that is not qcow2 at all. Raw and iso
// images are never probed: a caller checks only images it holds as
// qcow2. docs/instances.md describes the rules.
package qcow2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ReadBytes is how much of a file Parse is given: the header, its
// extensions and the backing file name must lie within it (qemu-img
// writes them in the first cluster, 64 KiB by default).
const ReadBytes = 64 << 10

// Magic starts every qcow2 image: "QFI\xfb".
const Magic = 0x514649fb

// Incompatible feature bits (qcow2 version 3).
const (
	IncompatDirty       = 1 << 0
	IncompatCorrupt     = 1 << 1
	IncompatDataFile    = 1 << 2
	IncompatCompression = 1 << 3
	IncompatExtendedL2  = 1 << 4
)

// Header extension types this package acts on.
const (
	extEnd           = 0x00000000
	extBackingFormat = 0xe2792aca
	extFullDiskCrypt = 0x0537be77
	extDataFile      = 0x44415441
)

// maxBackingName is QEMU's bound on a backing file name.
const maxBackingName = 1023

// Header is what Parse read.
type Header struct {
	Version     uint32
	VirtualSize uint64
	ClusterBits uint32
	// Backing is the backing file name ("" for none) and BackingFormat
	// its format from the header extension ("" when not given).
	Backing       string
	BackingFormat string
	Incompatible  uint64
}

// ErrNotQCOW2 is a file without the qcow2 magic.
var ErrNotQCOW2 = errors.New("not a qcow2 image")

// Parse reads the header at the start of b (at most ReadBytes of the
// file; a shorter b is a shorter file) and refuses an image that is not
// qcow2, is encrypted, names an external data file, carries an
// incompatible feature this package does not know or the corrupt bit, or
// whose header, extensions or backing name do not lie within b. It says
// nothing yet about the backing file: see Check.
func Parse(b []byte) (Header, error) {
	var h Header
	be := binary.BigEndian
	if len(b) < 72 || be.Uint32(b) != Magic {
		return h, ErrNotQCOW2
	}
	h.Version = be.Uint32(b[4:])
	if h.Version != 2 && h.Version != 3 {
		return h, fmt.Errorf("qcow2 version %d: only 2 and 3 are read", h.Version)
	}
	backingOff := be.Uint64(b[8:])
	backingLen := be.Uint32(b[16:])
	h.ClusterBits = be.Uint32(b[20:])
	h.VirtualSize = be.Uint64(b[24:])
	if h.ClusterBits < 9 || h.ClusterBits > 21 {
		return h, fmt.Errorf("qcow2 cluster bits %d: 9 to 21", h.ClusterBits)
	}
	if crypt := be.Uint32(b[32:]); crypt != 0 {
		return h, fmt.Errorf("qcow2 image is encrypted (method %d)", crypt)
	}
	extStart := uint64(72)
	if h.Version == 3 {
		if len(b) < 104 {
			return h, errors.New("qcow2 version 3 header is cut short")
		}
		h.Incompatible = be.Uint64(b[72:])
		hlen := be.Uint32(b[100:])
		if hlen < 104 || uint64(hlen) > uint64(len(b)) {
			return h, fmt.Errorf("qcow2 header length %d does not fit", hlen)
		}
		extStart = uint64(hlen)
		switch {
		case h.Incompatible&IncompatDataFile != 0:
			return h, errors.New("qcow2 image names an external data file")
		case h.Incompatible&IncompatCorrupt != 0:
			return h, errors.New("qcow2 image is marked corrupt")
		case h.Incompatible&^(IncompatDirty|IncompatCompression|IncompatExtendedL2) != 0:
			return h, fmt.Errorf("qcow2 image has unknown incompatible features %#x", h.Incompatible&^(IncompatDirty|IncompatCompression|IncompatExtendedL2))
		}
	}
	if err := h.extensions(b, extStart); err != nil {
		return h, err
	}
	if backingOff != 0 || backingLen != 0 {
		if backingLen == 0 || backingLen > maxBackingName {
			return h, fmt.Errorf("qcow2 backing file name of %d bytes: 1 to %d", backingLen, maxBackingName)
		}
		if backingOff > uint64(len(b)) || uint64(len(b))-backingOff < uint64(backingLen) {
			return h, fmt.Errorf("qcow2 backing file name lies past the first %d bytes", len(b))
		}
		h.Backing = string(b[backingOff : backingOff+uint64(backingLen)])
	}
	return h, nil
}

// extensions walks the header extensions from off to their end marker.
func (h *Header) extensions(b []byte, off uint64) error {
	be := binary.BigEndian
	for {
		if off > uint64(len(b)) || uint64(len(b))-off < 8 {
			return fmt.Errorf("qcow2 header extensions run past the first %d bytes", len(b))
		}
		typ, n := be.Uint32(b[off:]), uint64(be.Uint32(b[off+4:]))
		off += 8
		if typ == extEnd {
			return nil
		}
		if uint64(len(b))-off < n {
			return fmt.Errorf("qcow2 header extension %#x runs past the first %d bytes", typ, len(b))
		}
		data := b[off : off+n]
		switch typ {
		case extFullDiskCrypt:
			return errors.New("qcow2 image carries an encryption header")
		case extDataFile:
			return errors.New("qcow2 image names an external data file")
		case extBackingFormat:
			h.BackingFormat = string(data)
		}
		off += (n + 7) &^ 7
	}
}

// Backing is what an image may name as its backing file: nothing (a base
// image, or a flat disk), or exactly Path in Format.
type Backing struct {
	Path   string
	Format string
}

// Check is Parse and the backing rule: an image that names a backing
// file is refused unless want names that same file and format (QEMU
// would probe a backing file whose format is not given, so an overlay
// without it is refused too); an image that names none passes only when
// want names none.
func Check(b []byte, want Backing) (Header, error) {
	h, err := Parse(b)
	if err != nil {
		return h, err
	}
	switch {
	case want.Path == "" && h.Backing != "":
		return h, fmt.Errorf("qcow2 image names a backing file (%q); a base image may name none", h.Backing)
	case want.Path != "" && h.Backing != want.Path:
		return h, fmt.Errorf("qcow2 overlay names backing file %q, not its recorded base %q", h.Backing, want.Path)
	case want.Path != "" && h.BackingFormat != want.Format:
		return h, fmt.Errorf("qcow2 overlay gives backing format %q, not %q", h.BackingFormat, want.Format)
	}
	return h, nil
}

// CheckFile reads the first ReadBytes of the file at path, opened
// without following a symlink in its last component, and runs Check. It
// refuses anything but a regular file.
func CheckFile(path string, want Backing) (Header, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Header{}, fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Header{}, fmt.Errorf("stat image: %w", err)
	}
	if !st.Mode().IsRegular() {
		return Header{}, fmt.Errorf("image %s is not a regular file", path)
	}
	b := make([]byte, ReadBytes)
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return Header{}, fmt.Errorf("read image header: %w", err)
	}
	h, err := Check(b[:n], want)
	if err != nil {
		return h, fmt.Errorf("image %s: %w", path, err)
	}
	return h, nil
}
