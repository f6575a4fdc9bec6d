//go:build linux

package xid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"syscall"
)

// KmsgPath is the kernel's log device.
const KmsgPath = "/dev/kmsg"

// ReadKmsg reads every record the kernel still holds in /dev/kmsg, from the
// oldest, and returns the Xid events among them. It never waits for new
// records: the device is opened non-blocking and reading stops when it
// answers EAGAIN. Records the kernel overwrote while reading (EPIPE) are
// skipped. Reading needs CAP_SYSLOG when kernel.dmesg_restrict is 1; the
// error then matches fs.ErrPermission.
func ReadKmsg(ctx context.Context) ([]Event, error) {
	fd, err := syscall.Open(KmsgPath, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return nil, fmt.Errorf("open %s O_RDONLY|O_NONBLOCK = %w (reading the kernel log needs root or CAP_SYSLOG when kernel.dmesg_restrict is 1)", KmsgPath, err)
		}
		return nil, fmt.Errorf("open %s O_RDONLY|O_NONBLOCK = %w", KmsgPath, err)
	}
	defer syscall.Close(fd)
	return readKmsg(&kmsgReader{ctx: ctx, fd: fd})
}

// kmsgReader turns the record-per-read device into a byte stream. Each
// read(2) must be given room for a whole record (EINVAL otherwise), so it
// reads into its own buffer, larger than the kernel's longest record.
type kmsgReader struct {
	ctx  context.Context
	fd   int
	buf  [16 << 10]byte
	r, w int
}

func (k *kmsgReader) Read(p []byte) (int, error) {
	for k.r == k.w {
		if err := k.ctx.Err(); err != nil {
			return 0, err
		}
		n, err := syscall.Read(k.fd, k.buf[:])
		switch {
		case err == syscall.EINTR, err == syscall.EPIPE:
			// Interrupted, or the record at our position was overwritten
			// (the next read returns the oldest record still held).
			continue
		case err == syscall.EAGAIN:
			return 0, io.EOF
		case err != nil:
			return 0, fmt.Errorf("read %s = %w", KmsgPath, err)
		case n <= 0:
			return 0, io.EOF
		}
		k.r, k.w = 0, n
	}
	n := copy(p, k.buf[k.r:k.w])
	k.r += n
	return n, nil
}
