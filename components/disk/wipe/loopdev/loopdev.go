// Package loopdev attaches regular files as loop block devices with the
// loop ioctls (LOOP_CTL_GET_FREE, LOOP_CONFIGURE, else LOOP_SET_FD and
// LOOP_SET_STATUS64), so root-tier tests run wipes and image writes
// against real block devices backed by sparse files.
package loopdev

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Device is an attached loop device.
type Device struct {
	Path    string // /dev/loopN
	Number  int
	loop    *os.File
	backing *os.File
}

// Attach attaches file to a free loop device; with partscan the kernel
// scans it for partitions. The device detaches (autoclear) once Detach
// closed it.
func Attach(file string, partscan bool) (*Device, error) {
	backing, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		backing.Close()
		return nil, err
	}
	defer ctl.Close()
	flags := uint32(unix.LO_FLAGS_AUTOCLEAR)
	if partscan {
		flags |= unix.LO_FLAGS_PARTSCAN
	}
	var lastErr error
	for try := 0; try < 10; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			backing.Close()
			return nil, fmt.Errorf("ioctl(/dev/loop-control, LOOP_CTL_GET_FREE) = %w", err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			// No udev (a container): make the node.
			if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
				backing.Close()
				return nil, fmt.Errorf("mknod(%s, 7:%d) = %w", path, n, err)
			}
		}
		loop, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			backing.Close()
			return nil, err
		}
		err = configure(loop, backing, flags)
		if err == nil {
			return &Device{Path: path, Number: n, loop: loop, backing: backing}, nil
		}
		loop.Close()
		lastErr = fmt.Errorf("%s: %w", path, err)
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(10 * time.Millisecond) // another process took it
	}
	backing.Close()
	return nil, lastErr
}

func configure(loop, backing *os.File, flags uint32) error {
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = flags
	err := unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return fmt.Errorf("ioctl(LOOP_CONFIGURE) = %w", err)
	}
	// Kernels before 5.8.
	if err := unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return fmt.Errorf("ioctl(LOOP_SET_FD) = %w", err)
	}
	info := unix.LoopInfo64{Flags: flags}
	if err := unix.IoctlLoopSetStatus64(int(loop.Fd()), &info); err != nil {
		unix.IoctlSetInt(int(loop.Fd()), unix.LOOP_CLR_FD, 0)
		return fmt.Errorf("ioctl(LOOP_SET_STATUS64) = %w", err)
	}
	return nil
}

// Detach detaches the device and closes the backing file.
func (d *Device) Detach() error {
	err := unix.IoctlSetInt(int(d.loop.Fd()), unix.LOOP_CLR_FD, 0)
	if errors.Is(err, unix.ENXIO) {
		err = nil // already detached
	}
	if err != nil {
		err = fmt.Errorf("ioctl(%s, LOOP_CLR_FD) = %w", d.Path, err)
	}
	d.loop.Close()
	d.backing.Close()
	return err
}
