package osinit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MountRoot mounts dev (ext4) on /sysroot and binds its etc/bcd and
// var/lib/bcd over /etc/bcd and /var/lib/bcd.
func MountRoot(dev string, printf func(string, ...any)) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear", dev)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.MkdirAll("/sysroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, "/sysroot", "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount(%s, /sysroot, ext4) = %w", dev, err)
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{"etc/bcd", 0o755}, {"var/lib/bcd", 0o700}} {
		src, dst := filepath.Join("/sysroot", d.path), "/"+d.path
		for _, p := range []string{src, dst} {
			if err := os.MkdirAll(p, d.mode); err != nil {
				return err
			}
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mount(%s, %s, bind) = %w", src, dst, err)
		}
	}
	printf("root file system %s mounted; /etc/bcd and /var/lib/bcd are its own", dev)
	// The OS is named after the node it joins as, when the deploy said.
	if b, err := os.ReadFile("/etc/bcd/node-id"); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" && len(id) <= 63 && !strings.ContainsAny(id, " \t/") {
			if err := unix.Sethostname([]byte(id)); err != nil {
				printf("sethostname(%s) = %v", id, err)
			}
		}
	}
	return nil
}
