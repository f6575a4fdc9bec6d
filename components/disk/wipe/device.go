package wipe

import (
	"io"
	"time"
)

// Device is one disk as a wipe sees it. Open gives the real one (a block
// device with its ioctls, or a regular file); tests give a fake with a
// simulated NVMe controller.
type Device interface {
	Path() string
	Size() int64
	// Kind describes the device for the report: "block device",
	// "NVMe namespace 1", "regular file".
	Kind() string
	io.WriterAt
	// ReadBack reads what the medium holds, bypassing the page cache
	// (O_DIRECT, or the cache dropped first); it says how in ReadBackMethod.
	ReadBack(p []byte, off int64) (int, error)
	ReadBackMethod() string
	Sync() error
	// Partitions are the kernel's partitions of the device (sysfs), as
	// byte spans; none for a file.
	Partitions() ([]Span, error)
	// RereadPartitions is ioctl(BLKRRPART).
	RereadPartitions() error
	// SecureDiscard is ioctl(BLKSECDISCARD, [off, off+n)).
	SecureDiscard(off, n int64) error
	// NSID is the NVMe namespace id, 0 when the device is no NVMe
	// namespace (ioctl(NVME_IOCTL_ID)).
	NSID() uint32
	// Admin runs an NVMe admin command (ioctl(NVME_IOCTL_ADMIN_CMD)); a
	// completion status other than success is a StatusError. data is the
	// command's buffer (Addr and DataLen are set from it).
	Admin(cmd *AdminCmd, data []byte) error
	// SCSI runs a SCSI command (ioctl(SG_IO)) with data moving as dir
	// says; CHECK CONDITION is a *CheckCondition with the sense. A
	// device that is no SCSI device (virtio, a file) answers an error
	// that is not one.
	SCSI(cdb []byte, dir Dir, data []byte, timeout time.Duration) error
	Close() error
}

// Dir is the direction of a SCSI command's data.
type Dir int

// The directions.
const (
	DirNone Dir = iota
	DirIn       // from the device
	DirOut      // to the device
)

// Span is a byte range of a device.
type Span struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// End is the first byte after the span.
func (s Span) End() int64 { return s.Off + s.Len }
