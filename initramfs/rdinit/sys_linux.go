package rdinit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/disk/kmod"
	"golang.org/x/sys/unix"
)

// DefaultConfig is the layout of the ramdisk image on the running kernel.
func DefaultConfig() Config {
	return Config{
		Out:         os.Stdout,
		Cmdline:     "/proc/cmdline",
		ModulesRoot: "/lib/modules",
		Release:     release(),
		ModulesList: ModulesList,
		DriversList: DriversList,
		SysBus:      "/sys/bus",
		Match:       matcher("/lib/modules", release()),
		SysBlock:    "/sys/class/block",
		SysNet:      "/sys/class/net",
		BCD:         "/bin/bcd",
		Settle:      5 * time.Second,
		Quiet:       500 * time.Millisecond,
		Mount:       MountMissing,
		Load: func(names []string) ([]kmod.Result, error) {
			return kmod.NewLoader("/lib/modules", release()).Load(names...)
		},
		HasAgent: HasRamdiskCommand,
		Network:  func() []string { return DHCP(30 * time.Second) },
		RunAgent: func(bcd string, args []string) (int, error) {
			cmd := exec.Command(bcd, args...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode(), nil
			}
			if err != nil {
				return -1, err
			}
			return 0, nil
		},
		PowerOff: func() error {
			unix.Sync()
			if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
				return fmt.Errorf("reboot(LINUX_REBOOT_CMD_POWER_OFF) = %w", err)
			}
			return nil
		},
	}
}

// matcher reads the image's module index once, on the first match.
func matcher(root, release string) func(string) []string {
	var ix *kmod.Index
	var err error
	return func(modalias string) []string {
		if ix == nil && err == nil {
			ix, err = kmod.ReadIndex(filepath.Join(root, release))
		}
		if err != nil {
			return nil
		}
		return ix.Match(modalias)
	}
}

func release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// mounts are what the ramdisk needs; u-root's init mounts all but /run.
var mounts = []struct{ target, fstype, opts string }{
	{"/proc", "proc", ""},
	{"/sys", "sysfs", ""},
	{"/dev", "devtmpfs", ""},
	{"/run", "tmpfs", "mode=0755"},
}

// MountMissing mounts each of /proc, /sys, /dev and /run that is not a
// mount point yet (its device differs from its parent's once mounted).
func MountMissing() []error {
	var errs []error
	for _, m := range mounts {
		if mounted(m.target) {
			continue
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID|unix.MS_NODEV, m.opts); err != nil {
			if m.fstype == "devtmpfs" {
				// devtmpfs needs device nodes, so no MS_NODEV.
				err = unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID, m.opts)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("mount(%q, %q, %q, %q) = %w", m.fstype, m.target, m.fstype, m.opts, err))
			}
		}
	}
	return errs
}

func mounted(p string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(p, &st) != nil || unix.Stat(filepath.Dir(strings.TrimSuffix(p, "/")), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
