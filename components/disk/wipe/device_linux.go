package wipe

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NVMe ioctls: _IO('N', 0x40) and _IOWR('N', 0x41, struct nvme_passthru_cmd).
const (
	nvmeIoctlID       = 0x4e40
	nvmeIoctlAdminCmd = 0xc0484e41
)

// SysBlock is where Open finds a block device's partitions
// (/sys/dev/block/MAJ:MIN); tests may point it elsewhere.
var SysBlock = "/sys/dev/block"

// realDevice is a block device or a regular file.
type realDevice struct {
	path   string
	f      *os.File // O_RDWR, O_EXCL for a block device
	direct *os.File // O_RDONLY|O_DIRECT, nil when the kernel refused it
	block  bool
	size   int64
	sector int
	nsid   uint32
	rdev   uint64
}

// Open opens path for wiping: a block device exclusively (a mounted or
// otherwise held device fails with EBUSY), or a regular file.
func Open(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("stat(%s) = %w", path, err)
	}
	d := &realDevice{path: path, sector: 512}
	flags := os.O_RDWR
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		d.block, d.rdev = true, st.Rdev
		flags |= unix.O_EXCL
	case unix.S_IFREG:
	default:
		return nil, fmt.Errorf("wipe: %s is neither a block device nor a regular file", path)
	}
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open(%s, O_RDWR|O_EXCL) = %w", path, errors.Unwrap(err))
	}
	d.f = f
	if d.block {
		size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("ioctl(%s, BLKGETSIZE64) = %w", path, err)
		}
		d.size = int64(size)
		if ss, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && ss > 0 {
			d.sector = ss
		}
		r1, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlID, 0)
		if errno == 0 && int(r1) > 0 {
			d.nsid = uint32(r1)
		}
	} else {
		d.size = st.Size
	}
	if df, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0); err == nil {
		d.direct = df
	}
	return d, nil
}

func (d *realDevice) Path() string { return d.path }
func (d *realDevice) Size() int64  { return d.size }
func (d *realDevice) NSID() uint32 { return d.nsid }

func (d *realDevice) Kind() string {
	switch {
	case d.nsid != 0:
		return fmt.Sprintf("NVMe namespace %d", d.nsid)
	case d.block:
		return "block device"
	}
	return "regular file"
}

func (d *realDevice) WriteAt(p []byte, off int64) (int, error) {
	n, err := d.f.WriteAt(p, off)
	if err != nil {
		return n, fmt.Errorf("pwrite(%s, %d bytes, %d) = %w", d.path, len(p), off, unwrapPath(err))
	}
	return n, nil
}

func (d *realDevice) Sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("fsync(%s) = %w", d.path, unwrapPath(err))
	}
	return nil
}

func (d *realDevice) ReadBackMethod() string {
	switch {
	case d.direct != nil:
		return "O_DIRECT"
	case d.block:
		return "buffered after ioctl(BLKFLSBUF)"
	}
	return "buffered after posix_fadvise(DONTNEED)"
}

// ReadBack reads p at off from the medium. With O_DIRECT the transfer
// goes through an aligned buffer in whole sectors.
func (d *realDevice) ReadBack(p []byte, off int64) (int, error) {
	if d.direct == nil {
		if d.block {
			if err := unix.IoctlSetInt(int(d.f.Fd()), unix.BLKFLSBUF, 0); err != nil {
				return 0, fmt.Errorf("ioctl(%s, BLKFLSBUF) = %w", d.path, err)
			}
		} else {
			_ = unix.Fadvise(int(d.f.Fd()), off, int64(len(p)), unix.FADV_DONTNEED)
		}
		n, err := d.f.ReadAt(p, off)
		if err != nil {
			return n, fmt.Errorf("pread(%s, %d bytes, %d) = %w", d.path, len(p), off, unwrapPath(err))
		}
		return n, nil
	}
	align := int64(max(d.sector, 4096))
	start := off / align * align
	end := (off + int64(len(p)) + align - 1) / align * align
	if end > d.size && d.size%align == 0 {
		end = d.size
	}
	buf := aligned(int(end-start), int(align))
	n, err := d.direct.ReadAt(buf, start)
	if err != nil && n < int(off-start)+len(p) {
		return 0, fmt.Errorf("pread(%s O_DIRECT, %d bytes, %d) = %w", d.path, len(buf), start, unwrapPath(err))
	}
	return copy(p, buf[off-start:]), nil
}

// aligned returns an n-byte slice whose start is a multiple of align.
func aligned(n, align int) []byte {
	b := make([]byte, n+align)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % uintptr(align)); r != 0 {
		skip = align - r
	}
	return b[skip : skip+n : skip+n]
}

func (d *realDevice) Partitions() ([]Span, error) {
	if !d.block {
		return nil, nil
	}
	dir := filepath.Join(SysBlock, fmt.Sprintf("%d:%d", unix.Major(d.rdev), unix.Minor(d.rdev)))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("wipe: partitions of %s: %w", d.path, err)
	}
	var out []Span
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(p, "partition")); err != nil {
			continue
		}
		start, err1 := readInt(filepath.Join(p, "start"))
		size, err2 := readInt(filepath.Join(p, "size"))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("wipe: partition %s of %s: %w", e.Name(), d.path, err)
		}
		out = append(out, Span{Off: start * 512, Len: size * 512})
	}
	return out, nil
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

func (d *realDevice) RereadPartitions() error {
	if !d.block {
		return nil
	}
	if err := unix.IoctlSetInt(int(d.f.Fd()), unix.BLKRRPART, 0); err != nil {
		return fmt.Errorf("ioctl(%s, BLKRRPART) = %w", d.path, err)
	}
	return nil
}

func (d *realDevice) SecureDiscard(off, n int64) error {
	if !d.block {
		return fmt.Errorf("ioctl(%s, BLKSECDISCARD, [%d, %d]) = %w", d.path, off, n, unix.ENOTBLK)
	}
	r := [2]uint64{uint64(off), uint64(n)}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKSECDISCARD, uintptr(unsafe.Pointer(&r)))
	if errno != 0 {
		return fmt.Errorf("ioctl(%s, BLKSECDISCARD, [%d, %d]) = %w", d.path, off, n, errno)
	}
	return nil
}

func (d *realDevice) Admin(cmd *AdminCmd, data []byte) error {
	if d.nsid == 0 {
		return fmt.Errorf("ioctl(%s, NVME_IOCTL_ADMIN_CMD, %v) = %w (not an NVMe namespace)", d.path, cmd, unix.ENOTTY)
	}
	if len(data) > 0 {
		cmd.Addr = uint64(uintptr(unsafe.Pointer(&data[0])))
		cmd.DataLen = uint32(len(data))
	}
	r1, _, errno := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(cmd)))
	runtime.KeepAlive(data)
	switch {
	case errno != 0:
		return fmt.Errorf("ioctl(%s, NVME_IOCTL_ADMIN_CMD, %v) = %w", d.path, cmd, errno)
	case r1 != 0:
		return fmt.Errorf("ioctl(%s, NVME_IOCTL_ADMIN_CMD, %v) = %w", d.path, cmd, StatusError{Status: uint32(r1)})
	}
	return nil
}

// SG_IO and its header (struct sg_io_hdr, <scsi/sg.h>); Go lays the
// fields out as C does on 64-bit Linux.
const (
	sgIO          = 0x2285
	sgDxferNone   = -1
	sgDxferToDev  = -2
	sgDxferFromDv = -3
	scsiCheckCond = 0x02
)

type sgIOHdr struct {
	InterfaceID    int32
	DxferDirection int32
	CmdLen         uint8
	MxSbLen        uint8
	IovecCount     uint16
	DxferLen       uint32
	Dxferp         uintptr
	Cmdp           uintptr
	Sbp            uintptr
	Timeout        uint32
	Flags          uint32
	PackID         int32
	UsrPtr         uintptr
	Status         uint8
	MaskedStatus   uint8
	MsgStatus      uint8
	SbLenWr        uint8
	HostStatus     uint16
	DriverStatus   uint16
	Resid          int32
	Duration       uint32
	Info           uint32
}

func (d *realDevice) SCSI(cdb []byte, dir Dir, data []byte, timeout time.Duration) error {
	op := fmt.Sprintf("ioctl(%s, SG_IO, %s)", d.path, cdbName(cdb))
	if !d.block {
		return fmt.Errorf("%s = %w (not a block device)", op, unix.ENOTTY)
	}
	sense := make([]byte, 64)
	h := sgIOHdr{InterfaceID: 'S', CmdLen: uint8(len(cdb)), MxSbLen: uint8(len(sense)),
		Cmdp: uintptr(unsafe.Pointer(&cdb[0])), Sbp: uintptr(unsafe.Pointer(&sense[0])),
		Timeout: uint32(min(timeout.Milliseconds(), 1<<32-1))}
	switch dir {
	case DirIn:
		h.DxferDirection = sgDxferFromDv
	case DirOut:
		h.DxferDirection = sgDxferToDev
	default:
		h.DxferDirection = sgDxferNone
	}
	if len(data) > 0 {
		h.Dxferp, h.DxferLen = uintptr(unsafe.Pointer(&data[0])), uint32(len(data))
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), sgIO, uintptr(unsafe.Pointer(&h)))
	runtime.KeepAlive(cdb)
	runtime.KeepAlive(data)
	runtime.KeepAlive(sense)
	switch {
	case errno != 0:
		return fmt.Errorf("%s = %w", op, errno)
	case h.Status == scsiCheckCond:
		s, err := ParseSense(sense[:h.SbLenWr])
		if err != nil {
			return fmt.Errorf("%s: CHECK CONDITION with sense it cannot read: %w", op, err)
		}
		return &CheckCondition{Op: op, Sense: s}
	case h.Status != 0 || h.HostStatus != 0 || h.DriverStatus&0xf != 0:
		return fmt.Errorf("%s: status %02xh, host status %04xh, driver status %04xh", op, h.Status, h.HostStatus, h.DriverStatus)
	}
	return nil
}

func (d *realDevice) Close() error {
	if d.direct != nil {
		d.direct.Close()
	}
	return d.f.Close()
}

// unwrapPath drops *os.PathError's own "op path:" text, since the callers
// name the syscall and path themselves.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
