// Package wal is the journal's write-ahead log: records appended to a
// file, each framed with its length and a CRC32C, made durable by one
// fdatasync per group of records. The file is preallocated (fallocate) in
// segments, so an fdatasync flushes the records and not a change of the
// file's size as well.
//
// A file starts with a 16-byte header: the magic "bcdwal1\n" and the
// file's generation (uint64, little-endian). Then come frames:
//
//	length  uint32, little-endian, 1..MaxRecord
//	crc     uint32, little-endian: CRC32C of the generation, the length and the record
//	record  length bytes
//
// The end of the log is the first frame that does not hold (a zero or
// oversized length, a short record, a wrong CRC): a write torn by a crash
// or a power cut ends the log there and is never read as data. The
// generation in each CRC keeps a frame of one file from passing as a
// frame of another.
package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"syscall"
)

// Sizes.
const (
	Magic       = "bcdwal1\n"
	HeaderSize  = 16
	FrameHeader = 8
	MaxRecord   = 8 << 20
	// Segment is how much a log is preallocated by at a time, once it
	// holds FirstSegment; before that it doubles from FirstSegment, so a
	// journal that writes little (a simulated fleet's thousands of them)
	// takes little.
	Segment      = 1 << 20
	FirstSegment = 16 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(gen uint64, n uint32, rec []byte) uint32 {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], gen)
	binary.LittleEndian.PutUint32(b[8:], n)
	return crc32.Update(crc32.Update(0, castagnoli, b[:]), castagnoli, rec)
}

// AppendHeader appends a file header for generation gen to dst.
func AppendHeader(dst []byte, gen uint64) []byte {
	dst = append(dst, Magic...)
	return binary.LittleEndian.AppendUint64(dst, gen)
}

// AppendFrame appends rec, framed for a file of generation gen, to dst.
func AppendFrame(dst []byte, gen uint64, rec []byte) []byte {
	n := uint32(len(rec))
	dst = binary.LittleEndian.AppendUint32(dst, n)
	dst = binary.LittleEndian.AppendUint32(dst, checksum(gen, n, rec))
	return append(dst, rec...)
}

// Contents is what Parse found in a file.
type Contents struct {
	Gen     uint64
	Records [][]byte // slices of the bytes parsed
	// End is the offset just past the last good frame: where the next
	// record goes.
	End int64
	// Torn counts the bytes after End up to the last non-zero one: a tail
	// torn by a crash (zero in a log cut cleanly, whose rest is the
	// preallocated zeros).
	Torn int64
}

// ErrHeader is a file that does not start with a log header.
var ErrHeader = errors.New("not a bcd write-ahead log (bad header)")

// Parse reads a file's bytes: its header, then records up to the first
// frame that does not hold. Only a missing or wrong header is an error.
func Parse(b []byte) (Contents, error) {
	if len(b) < HeaderSize || string(b[:8]) != Magic {
		return Contents{}, ErrHeader
	}
	c := Contents{Gen: binary.LittleEndian.Uint64(b[8:16])}
	off := HeaderSize
	for len(b)-off >= FrameHeader {
		n := binary.LittleEndian.Uint32(b[off:])
		sum := binary.LittleEndian.Uint32(b[off+4:])
		if n == 0 || n > MaxRecord || uint64(len(b)-off-FrameHeader) < uint64(n) {
			break
		}
		rec := b[off+FrameHeader : off+FrameHeader+int(n)]
		if checksum(c.Gen, n, rec) != sum {
			break
		}
		c.Records = append(c.Records, rec)
		off += FrameHeader + int(n)
	}
	c.End = int64(off)
	for i := len(b) - 1; i >= off; i-- {
		if b[i] != 0 {
			c.Torn = int64(i + 1 - off)
			break
		}
	}
	return c, nil
}

// ReadFile reads and parses the file at path.
func ReadFile(path string) (Contents, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Contents{}, err
	}
	c, err := Parse(b)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// File is what a Log writes through: the log's own file (an *os.File
// whose Datasync is fdatasync), or in tests a file that loses at a
// simulated power cut whatever was not fdatasynced (package powercut), so
// a test of durability does not rest on the log's own count of what it
// synced.
type File interface {
	WriteAt(b []byte, off int64) (int, error)
	// Datasync makes what was written durable: fdatasync(2).
	Datasync() error
	Close() error
}

// osFile is a File on the operating system's file.
type osFile struct{ *os.File }

func (f osFile) Datasync() error { return syscall.Fdatasync(int(f.Fd())) }

// Log is a log file open for appending. It is not safe for concurrent
// use: the journal's writer is its one user.
type Log struct {
	f       File
	path    string
	gen     uint64
	size    int64 // bytes written: the header and the frames
	synced  int64 // bytes known to be on disk
	alloc   int64 // the file's allocated size
	segment int64
	buf     []byte
	dirty   int64 // the end of what a write may have reached, failed writes included
	err     error // the first write or sync that failed: the log takes no more
	syncs   uint64
}

// Create makes a new log file of generation gen at path (it must not
// exist). A log (segment > 0) is preallocated, its header and first
// segment written and fdatasynced at once, so a snapshot may name it; a
// file written once (segment 0, a snapshot) grows as written, and its
// writer syncs it. The caller fsyncs the directory.
func Create(path string, gen uint64, segment int64) (*Log, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return CreateOn(osFile{f}, path, gen, segment)
}

// CreateOn is Create on f, a new empty file at path (which it removes
// when it fails).
func CreateOn(f File, path string, gen uint64, segment int64) (*Log, error) {
	l := &Log{f: f, path: path, gen: gen, segment: segment}
	var err error
	hdr := AppendHeader(nil, gen)
	if segment > 0 {
		first := min(FirstSegment, segment)
		buf := append(hdr, make([]byte, first-HeaderSize)...)
		if _, err = f.WriteAt(buf, 0); err == nil {
			l.size, l.alloc = HeaderSize, first
			err = l.Sync()
		}
	} else {
		err = l.write(hdr)
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return l, nil
}

// Path is the log's file.
func (l *Log) Path() string { return l.path }

// Gen is the log's generation.
func (l *Log) Gen() uint64 { return l.gen }

// Size is how many bytes were written (header and frames).
func (l *Log) Size() int64 { return l.size }

// Synced is how many of them are known to be on disk.
func (l *Log) Synced() int64 { return l.synced }

// Syncs counts the fdatasyncs issued.
func (l *Log) Syncs() uint64 { return l.syncs }

// Append writes the records, framed, after the last one, in one write. They
// are not durable until Sync returns.
func (l *Log) Append(recs [][]byte) error {
	l.buf = l.buf[:0]
	for _, r := range recs {
		if len(r) == 0 || len(r) > MaxRecord {
			return fmt.Errorf("wal: a record of %d bytes (1..%d)", len(r), MaxRecord)
		}
		l.buf = AppendFrame(l.buf, l.gen, r)
	}
	return l.write(l.buf)
}

func (l *Log) write(b []byte) error {
	if l.err != nil {
		return l.err
	}
	if end := l.size + int64(len(b)); l.segment > 0 && end > l.alloc {
		if err := l.grow(end); err != nil {
			l.err = err
			return err
		}
	}
	l.dirty = max(l.dirty, l.size+int64(len(b)))
	if _, err := l.f.WriteAt(b, l.size); err != nil {
		l.err = fmt.Errorf("write %s at %d: %w", l.path, l.size, err)
		return l.err
	}
	l.size += int64(len(b))
	return nil
}

// grow preallocates the file past end by whole segments: zeros written
// and fdatasynced, so the blocks are allocated and initialized (not
// fallocate's unwritten extents, whose conversion on first write makes
// every later fdatasync commit the file system's journal too) and the
// file's size is on disk. A commit's fdatasync then flushes only the
// records' own blocks. This is the one fdatasync per segment beyond the
// commits'.
func (l *Log) grow(end int64) error {
	step := min(max(l.alloc, FirstSegment), l.segment)
	n := (end - l.alloc + step - 1) / step * step
	if _, err := l.f.WriteAt(make([]byte, n), l.alloc); err != nil {
		return fmt.Errorf("preallocate %s: write at %d: %w", l.path, l.alloc, err)
	}
	l.syncs++
	if err := l.f.Datasync(); err != nil {
		return fmt.Errorf("preallocate: fdatasync(%s) = %w", l.path, err)
	}
	l.alloc += n
	return nil
}

// Sync makes every record appended so far durable (fdatasync). After a
// failed sync the log takes nothing more: what it holds past Synced is
// unknown.
func (l *Log) Sync() error {
	if l.err != nil {
		return l.err
	}
	l.syncs++
	if err := l.f.Datasync(); err != nil {
		l.err = fmt.Errorf("fdatasync(%s) = %w", l.path, err)
		return l.err
	}
	l.synced = l.size
	return nil
}

// Fail marks the log failed with err, as a failed sync would: it takes
// nothing more.
func (l *Log) Fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// Discard overwrites with zeros whatever was written past Synced, failed
// writes included, and fdatasyncs, so the log read again ends at Synced.
// Frames whose fdatasync failed are whole and carry valid checksums: left
// in place, this boot's page cache would hand them to the next reader (a
// restart) as if they had been committed. It works on a failed log too.
func (l *Log) Discard() error {
	if l.dirty <= l.synced {
		return nil
	}
	if _, err := l.f.WriteAt(make([]byte, l.dirty-l.synced), l.synced); err != nil {
		return fmt.Errorf("discard %s past %d: %w", l.path, l.synced, err)
	}
	l.syncs++
	if err := l.f.Datasync(); err != nil {
		return fmt.Errorf("discard: fdatasync(%s) = %w", l.path, err)
	}
	l.dirty = l.synced
	return nil
}

// Close closes the file.
func (l *Log) Close() error { return l.f.Close() }

// SyncDir fsyncs a directory, so the names created, renamed or removed in
// it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync(%s) = %w", dir, err)
	}
	return nil
}
