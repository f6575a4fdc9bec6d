// Package deploy writes an OS image onto a disk for the ramdisk's
// deploy.image command: it streams the image through SHA-256 and gzip or
// zstd decompression (klauspost/compress) straight onto the target block
// device or file, with no temporary copy, reports progress as it goes and
// fsyncs at the end. The target is opened O_DIRECT where its file system
// allows it, so the written bytes skip the page cache (the image's last
// partial block is written after O_DIRECT is turned off).
//
// The digest is of the image as delivered (the compressed bytes the site
// cache stores by digest), so it is known only once the last byte has been
// read and written. A mismatch, or any failure after writing began, leaves
// the target unbootable: the first MiB (partition tables, boot sectors) and
// the last MiB written (a backup GPT) are zeroed and read back, and the
// command fails.
package deploy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/filehash"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/better-compute/bcd/components/disk/wipe"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Compression of an image.
type Compression string

// Compressions. Auto sniffs the magic bytes.
const (
	Auto Compression = ""
	None Compression = "none"
	Gzip Compression = "gzip"
	Zstd Compression = "zstd"
)

// ParseCompression checks a compression name ("" or "auto" is Auto).
func ParseCompression(s string) (Compression, error) {
	switch c := Compression(s); c {
	case Auto, None, Gzip, Zstd:
		return c, nil
	case "auto":
		return Auto, nil
	}
	return "", fmt.Errorf("deploy: unknown compression %q (none, gzip, zstd or auto)", s)
}

// Sniff names the compression the first bytes of an image announce: gzip,
// zstd, or none. xz and bzip2 are recognised to be refused by name.
func Sniff(head []byte) (Compression, error) {
	switch {
	case len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b:
		return Gzip, nil
	case len(head) >= 4 && string(head[:4]) == "\x28\xb5\x2f\xfd":
		return Zstd, nil
	case len(head) >= 6 && string(head[:6]) == "\xfd7zXZ\x00":
		return "", errors.New("deploy: the image is xz-compressed; only gzip and zstd are supported")
	case len(head) >= 3 && string(head[:3]) == "BZh":
		return "", errors.New("deploy: the image is bzip2-compressed; only gzip and zstd are supported")
	}
	return None, nil
}

// Progress is reported while an image is written.
type Progress struct {
	Read    int64 // image bytes read (compressed)
	Written int64 // bytes written to the target
	Done    bool  // the last report, after fsync and the digest check
}

// Result describes a finished write.
type Result struct {
	Target      string
	Compression Compression
	Read        int64  // image bytes
	Written     int64  // bytes on the target
	SHA256      string // of the image as read
	Took        time.Duration
	// Notes are things that went wrong without failing the write, such as
	// the kernel refusing to re-read the new partition table.
	Notes []string
}

// Writer writes images. The zero value uses the defaults.
type Writer struct {
	// ProgressEvery is how many written bytes pass between progress
	// reports (default 64 MiB).
	ProgressEvery int64
	// BufferSize is the size of each write to the target (default 4 MiB,
	// rounded up to 4 KiB for O_DIRECT); four buffers are in flight.
	BufferSize int
}

// Write writes src onto dst with a default Writer. See Writer.Write.
func Write(ctx context.Context, src io.Reader, digest string, c Compression, dst string, progress func(Progress)) (Result, error) {
	return (&Writer{}).Write(ctx, src, digest, c, dst, progress)
}

// Write streams src through SHA-256 and its decompressor onto dst, a block
// device (opened exclusively) or a file path (created or truncated).
// digest is the lowercase hex SHA-256 of src; c is Auto, or a compression
// that must match what src's first bytes announce (None takes src as it
// is). progress may be nil; it is called from the goroutine that writes,
// one call at a time.
func (w *Writer) Write(ctx context.Context, src io.Reader, digest string, c Compression, dst string, progress func(Progress)) (Result, error) {
	start := time.Now()
	res := Result{Target: dst}
	fail := func(err error) (Result, error) {
		res.Took = time.Since(start)
		return res, fmt.Errorf("deploy %s: %w", dst, err)
	}
	if err := checkDigest(digest); err != nil {
		return fail(err)
	}
	every := w.ProgressEvery
	if every <= 0 {
		every = 64 << 20
	}
	bufSize := w.BufferSize
	if bufSize <= 0 {
		bufSize = defaultBuf
	}

	h := sha256.New()
	in := &countingReader{r: io.TeeReader(src, h)}
	br := bufio.NewReaderSize(in, 1<<20)
	head, err := br.Peek(6)
	if err != nil && !errors.Is(err, io.EOF) {
		return fail(fmt.Errorf("reading the image: %w", err))
	}
	sniffed, err := Sniff(head)
	if err != nil {
		return fail(err)
	}
	switch {
	case c == Auto:
		c = sniffed
	case c == None:
	case c != sniffed:
		return fail(fmt.Errorf("%s was asked for, but the image starts like %s", c, sniffed))
	}
	res.Compression = c

	t, err := openTarget(dst)
	if err != nil {
		return fail(err)
	}
	out := &progressWriter{ctx: ctx, w: t.f, direct: t.direct, every: every, next: every, report: progress, in: in}
	bw := newAsyncWriter(out, bufSize, 4)
	copyErr := decompress(c, br, bw)
	if copyErr == nil {
		// Bytes after the compressed stream are part of the image and its
		// digest; a decompressor may stop before EOF.
		if _, err := io.Copy(io.Discard, br); err != nil {
			copyErr = fmt.Errorf("reading the image: %w", err)
		}
	}
	if err := bw.Close(); copyErr == nil {
		copyErr = err
	}
	if copyErr == nil {
		if err := t.f.Sync(); err != nil {
			copyErr = fmt.Errorf("fsync(%s) = %w", dst, unwrapPath(err))
		}
	}
	res.Read, res.Written = in.n.Load(), out.n.Load()
	res.SHA256 = hex.EncodeToString(h.Sum(nil))
	if copyErr == nil && res.SHA256 != digest {
		copyErr = fmt.Errorf("the image's sha256 is %s, want %s", res.SHA256, digest)
	}
	if copyErr != nil {
		t.f.Close()
		if res.Written > 0 || t.block {
			copyErr = fmt.Errorf("%w; %s", copyErr, unbootable(dst, res.Written))
		} else {
			copyErr = fmt.Errorf("%w; nothing was written to it", copyErr)
		}
		return fail(copyErr)
	}
	if t.block {
		if err := RereadPartitions(t.f); err != nil {
			res.Notes = append(res.Notes, fmt.Sprintf("%v: the kernel sees the new partitions after a reboot or kexec", err))
		}
	}
	if err := t.f.Close(); err != nil {
		return fail(fmt.Errorf("close(%s) = %w", dst, unwrapPath(err)))
	}
	res.Took = time.Since(start)
	if progress != nil {
		progress(Progress{Read: res.Read, Written: res.Written, Done: true})
	}
	return res, nil
}

func checkDigest(d string) error {
	if !filehash.ValidDigest(d) {
		return fmt.Errorf("digest %q is not 64 lowercase hex digits of SHA-256", d)
	}
	return nil
}

func decompress(c Compression, r io.Reader, w io.Writer) error {
	switch c {
	case Gzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer z.Close()
		if _, err := z.WriteTo(w); err != nil {
			return wrapStream("gzip", err)
		}
		return nil
	case Zstd:
		// The stream decoder pipelines a frame's block decoding, sequence
		// decoding and history over zstdConcurrency goroutines.
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(zstdConcurrency), zstd.WithDecoderLowmem(zstdLowMem))
		if err != nil {
			return fmt.Errorf("zstd: %w", err)
		}
		defer z.Close()
		if _, err := z.WriteTo(w); err != nil {
			return wrapStream("zstd", err)
		}
		return nil
	}
	if _, err := io.Copy(w, r); err != nil {
		return wrapStream("copy", err)
	}
	return nil
}

// Tuned with make bench's BenchmarkDeploy on the 2-core lab machine
// (docs/decisions.md, 2026-12-02): 4 MiB writes; zstd decoding on two
// goroutines with its larger buffers (lowmem off) spent about a third less
// CPU than four goroutines with lowmem on; O_DIRECT (openDirect) saves the
// copy into the page cache.
var (
	defaultBuf      = 4 << 20
	zstdConcurrency = 2
	zstdLowMem      = false
)

// wrapStream keeps write errors (already phrased) apart from the
// decompressor's own.
func wrapStream(what string, err error) error {
	var we writeError
	if errors.As(err, &we) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

type target struct {
	f      *os.File
	block  bool
	direct bool // opened O_DIRECT: writes bypass the page cache
}

// directIO opens targets O_DIRECT where the file system allows it.
var directIO = true

// directAlign is the alignment O_DIRECT asks of buffers, offsets and
// lengths: 4096 covers 512- and 4096-byte logical blocks.
const directAlign = 4096

// openDirect opens path with flags, adding O_DIRECT when directIO is set
// and the file system takes it (tmpfs refuses it with EINVAL).
func openDirect(path string, flags int, perm os.FileMode) (*os.File, bool, error) {
	if directIO {
		f, err := os.OpenFile(path, flags|unix.O_DIRECT, perm)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, false, err
		}
	}
	f, err := os.OpenFile(path, flags, perm)
	return f, false, err
}

func openTarget(dst string) (*target, error) {
	var st unix.Stat_t
	err := unix.Stat(dst, &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK:
		f, direct, err := openDirect(dst, os.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open(%s, O_WRONLY|O_EXCL) = %w", dst, unwrapPath(err))
		}
		return &target{f: f, block: true, direct: direct}, nil
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s is neither a block device nor a regular file", dst)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return nil, fmt.Errorf("stat(%s) = %w", dst, err)
	}
	f, direct, err := openDirect(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open(%s, O_WRONLY|O_CREAT|O_TRUNC) = %w", dst, unwrapPath(err))
	}
	return &target{f: f, direct: direct}, nil
}

// unbootable zeroes the first MiB and the last MiB written of dst and
// reads them back, and says what it did.
func unbootable(dst string, written int64) string {
	d, err := wipe.Open(dst)
	if err != nil {
		return fmt.Sprintf("COULD NOT LEAVE IT UNBOOTABLE: %v", err)
	}
	defer d.Close()
	head := wipe.Span{Off: 0, Len: min(wipe.MiB, d.Size())}
	if head.Len == 0 {
		return "nothing was written"
	}
	spans, what := []wipe.Span{head}, "the first MiB"
	if written > head.End() {
		off := max(written-wipe.MiB, head.End())
		spans = append(spans, wipe.Span{Off: off, Len: written - off})
		what += " and the last MiB written"
	}
	if err := wipe.ZeroSpans(d, spans); err != nil {
		return fmt.Sprintf("COULD NOT LEAVE IT UNBOOTABLE: zeroing %s: %v", what, err)
	}
	return fmt.Sprintf("zeroed %s of %s and read them back (%s): the target is left unbootable", what, dst, d.ReadBackMethod())
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// writeError is a failed write to the target, phrased like the syscall.
type writeError struct{ err error }

func (e writeError) Error() string { return e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

// progressWriter writes to the target, checks the context and reports
// progress every so many bytes. It runs in asyncWriter's goroutine.
type progressWriter struct {
	ctx    context.Context
	w      *os.File
	direct bool // w is O_DIRECT: a write of an unaligned length turns it off first
	n      atomic.Int64
	every  int64
	next   int64
	report func(Progress)
	in     *countingReader
}

func (p *progressWriter) Write(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	if p.direct && len(b)%directAlign != 0 {
		// The image's last bytes: O_DIRECT takes only whole blocks.
		if err := clearDirect(p.w); err != nil {
			return 0, writeError{err}
		}
		p.direct = false
	}
	n, err := p.w.Write(b)
	written := p.n.Add(int64(n))
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return n, writeError{fmt.Errorf("write(%s, %d bytes at %d) = %w: the image is larger than the target", p.w.Name(), len(b), written-int64(n), unix.ENOSPC)}
		}
		return n, writeError{fmt.Errorf("write(%s, %d bytes at %d) = %w", p.w.Name(), len(b), written-int64(n), unwrapPath(err))}
	}
	if p.report != nil && written >= p.next {
		p.report(Progress{Read: p.in.n.Load(), Written: written})
		for p.next <= written {
			p.next += p.every
		}
	}
	return n, nil
}

func clearDirect(f *os.File) error {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl&^unix.O_DIRECT)
	}
	if err != nil {
		return fmt.Errorf("fcntl(%s, F_SETFL, ~O_DIRECT) = %w", f.Name(), err)
	}
	return nil
}

// asyncWriter hands full buffers to a goroutine that writes them, so
// decompressing the next buffer overlaps writing the last one (as in
// `zstd -dc | dd`, two processes).
type asyncWriter struct {
	w    io.Writer
	free chan []byte
	work chan []byte
	done chan struct{}
	cur  []byte
	mu   sync.Mutex
	err  error
}

func newAsyncWriter(w io.Writer, size, n int) *asyncWriter {
	a := &asyncWriter{w: w, free: make(chan []byte, n), work: make(chan []byte, n), done: make(chan struct{})}
	size = (size + directAlign - 1) / directAlign * directAlign
	for range n {
		// Aligned for O_DIRECT.
		b := make([]byte, size+directAlign)
		off := 0
		if r := int(uintptr(unsafe.Pointer(&b[0])) % directAlign); r != 0 {
			off = directAlign - r
		}
		a.free <- b[off : off : off+size]
	}
	go a.loop()
	return a
}

func (a *asyncWriter) loop() {
	defer close(a.done)
	for b := range a.work {
		if a.failed() == nil {
			if _, err := a.w.Write(b); err != nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
			}
		}
		a.free <- b[:0]
	}
}

func (a *asyncWriter) failed() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (a *asyncWriter) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if err := a.failed(); err != nil {
			return written, err
		}
		if a.cur == nil {
			a.cur = <-a.free
		}
		n := copy(a.cur[len(a.cur):cap(a.cur)], p)
		a.cur = a.cur[:len(a.cur)+n]
		p, written = p[n:], written+n
		if len(a.cur) == cap(a.cur) {
			a.work <- a.cur
			a.cur = nil
		}
	}
	return written, nil
}

// Close writes what is buffered, waits for the writes and returns the
// first error.
func (a *asyncWriter) Close() error {
	if len(a.cur) > 0 {
		a.work <- a.cur
		a.cur = nil
	}
	close(a.work)
	<-a.done
	return a.failed()
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Digest returns the hex SHA-256 of r, for callers and tests that need the
// digest of an image they hold.
func Digest(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Unbootable leaves a target that was written but must not boot (its
// installed OS could not be configured) unbootable, as a digest mismatch
// does, and says what it did.
func Unbootable(dst string, written int64) string { return unbootable(dst, written) }

// RereadPartitions asks the kernel to read the partition table of the
// block device f again (BLKRRPART), retrying for up to 2 s while the
// device is busy (udev or a mount still holding a partition).
func RereadPartitions(f *os.File) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("ioctl(%s, BLKRRPART) = %w", f.Name(), err)
	}
	return nil
}
