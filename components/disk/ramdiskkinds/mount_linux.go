package ramdiskkinds

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/disk/deploy"
)

// partitionPath names partition n of disk the way the kernel does:
// /dev/vda1, but /dev/nvme0n1p1 and /dev/loop0p1 after a digit.
func partitionPath(disk string, n int) string {
	if last := disk[len(disk)-1]; last >= '0' && last <= '9' {
		return fmt.Sprintf("%sp%d", disk, n)
	}
	return fmt.Sprintf("%s%d", disk, n)
}

// fsTypes are tried in order when mounting an installed OS's partition.
var fsTypes = []string{"ext4", "xfs", "btrfs", "vfat"}

// mountPartition mounts partition n of disk (nosuid, nodev, noexec) on a
// new directory under /run and returns it with the function that
// unmounts it (which syncs the file system).
func mountPartition(disk string, n int, readOnly bool) (string, func() error, error) {
	// The table may be new (deploy.Write re-read it, but a busy device
	// can defer that) or written by something else: read it again.
	f, err := os.Open(disk)
	if err != nil {
		return "", nil, err
	}
	err = deploy.RereadPartitions(f)
	f.Close()
	if err != nil {
		return "", nil, err
	}
	dev := partitionPath(disk, n)
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := os.Stat(dev)
		if err == nil && st.Mode()&os.ModeDevice != 0 {
			break
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("partition %d of %s: %s did not appear (is there a partition table with that partition?)", n, disk, dev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return mountDevice(dev, readOnly)
}

// mountDevice mounts a block device holding a file system on a new
// directory under /run.
func mountDevice(dev string, readOnly bool) (string, func() error, error) {
	dir, err := os.MkdirTemp("/run", "bcd-mnt-")
	if err != nil {
		return "", nil, err
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	var errs []string
	for _, fs := range fsTypes {
		err := unix.Mount(dev, dir, fs, flags, "")
		if err == nil {
			return dir, func() error {
				if err := unix.Unmount(dir, 0); err != nil {
					return fmt.Errorf("umount(%s) = %w", dir, err)
				}
				return os.Remove(dir)
			}, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", fs, err))
	}
	os.Remove(dir)
	return "", nil, fmt.Errorf("mount(%s) as %s failed (the ramdisk needs the file system's module)", dev, strings.Join(errs, ", "))
}
