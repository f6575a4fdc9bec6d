package ramdiskkinds

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// memfd puts b in an anonymous memory file (kexec_file_load takes fds).
func memfd(name string, b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create(%s) = %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", name, err)
	}
	return f, nil
}

func kexecFileLoad(kernel, initrd []byte, cmdline string) error {
	kf, err := memfd("kernel", kernel)
	if err != nil {
		return err
	}
	defer kf.Close()
	ifd, flags := -1, 0
	if initrd != nil {
		f, err := memfd("initrd", initrd)
		if err != nil {
			return err
		}
		defer f.Close()
		ifd = int(f.Fd())
	} else {
		flags |= unix.KEXEC_FILE_NO_INITRAMFS
	}
	if err := unix.KexecFileLoad(int(kf.Fd()), ifd, cmdline, flags); err != nil {
		return fmt.Errorf("kexec_file_load(kernel %d bytes, initrd %d bytes, %d-byte cmdline) = %w", len(kernel), len(initrd), len(cmdline), err)
	}
	return nil
}

func kexecRebootNow() error {
	unix.Sync()
	linksDown()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_KEXEC); err != nil {
		return fmt.Errorf("reboot(LINUX_REBOOT_CMD_KEXEC) = %w", err)
	}
	return nil
}

// linksDown takes every network interface but loopback down before the
// jump into the next kernel: a NIC left up keeps receiving into the old
// kernel's buffers by DMA while the new kernel reuses that memory (seen
// as a corrupted kernel in QEMU's e1000e after kexec). Best effort: the
// kernel's own device shutdown follows.
func linksDown() {
	ifs, err := net.Interfaces()
	if err != nil {
		return
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || i.Flags&net.FlagUp == 0 {
			continue
		}
		req, err := unix.NewIfreq(i.Name)
		if err != nil {
			continue
		}
		if unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, req) != nil {
			continue
		}
		req.SetUint16(req.Uint16() &^ unix.IFF_UP)
		_ = unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, req)
	}
}
