package rootvirt

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// ptyMajors are the device majors of Unix98 pseudo-terminal slaves
// (UNIX98_PTY_SLAVE_MAJOR, 136, and the 7 after it): the only files a
// console opens.
const ptyMajorFirst, ptyMajorLast = 136, 143

// Console opens the serial console of running (or paused) domain id, one bcd's
// metadata names: the pty libvirt reports for its console (virsh
// ttyconsole), opened as root without becoming the helper's controlling
// terminal and without following a link, and only a pseudo-terminal
// slave. The domain's run (its libvirt domain id) and its pty are read
// before and after the open and must agree, so the file is the pty of
// that very QEMU: a pty number a stopped domain gave up, taken by
// another terminal meanwhile, is never handed out.
func (Ops) Console(ctx context.Context, h helper.LibvirtHost, id string) (*os.File, bool, error) {
	f, err := console(ctx, h, id)
	final, err := result(err)
	return f, final, err
}

func console(ctx context.Context, h helper.LibvirtHost, id string) (*os.File, error) {
	found, err := owned(ctx, h, id)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, refuse("%s: %v: %s", wire.OpLibvirtConsole, vmruntime.ErrNotFound, id)
	}
	before, err := consoleOf(ctx, h, id)
	if err != nil {
		return nil, err
	}
	f, err := openPTY(before.tty)
	if err != nil {
		return nil, err
	}
	after, err := consoleOf(ctx, h, id)
	if err != nil || after != before {
		f.Close()
		if err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%s: instance %s stopped or restarted while its console opened; try again", wire.OpLibvirtConsole, id)
	}
	return f, nil
}

// run is a running domain's libvirt id and console pty.
type run struct{ domid, tty string }

// consoleOf reads what libvirt says of running domain id's console.
func consoleOf(ctx context.Context, h helper.LibvirtHost, id string) (run, error) {
	out, err := h.Virsh(ctx, nil, "domstate", id)
	if err != nil {
		return run{}, err
	}
	if st := strings.TrimSpace(string(out)); st != "running" && st != "paused" {
		return run{}, refuse("%s: instance %s is %s: only a running (or paused) instance has a console", wire.OpLibvirtConsole, id, st)
	}
	out, err = h.Virsh(ctx, nil, "domid", id)
	if err != nil {
		return run{}, err
	}
	domid := strings.TrimSpace(string(out))
	if n, err := strconv.Atoi(domid); err != nil || n <= 0 {
		return run{}, fmt.Errorf("%s: virsh domid %s printed %q", wire.OpLibvirtConsole, id, clipOut(domid))
	}
	out, err = h.Virsh(ctx, nil, "ttyconsole", id)
	if err != nil {
		return run{}, err
	}
	tty := strings.TrimSpace(string(out))
	if !ptsPath(tty) {
		return run{}, refuse("%s: instance %s's console is %q, not a pseudo-terminal", wire.OpLibvirtConsole, id, clipOut(tty))
	}
	return run{domid: domid, tty: tty}, nil
}

// ptsPath reports whether p is /dev/pts/<number>.
func ptsPath(p string) bool {
	n, ok := strings.CutPrefix(p, "/dev/pts/")
	if !ok || n == "" || len(n) > 9 {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// openPTY opens p read-write, never as a controlling terminal nor
// through a symlink, and keeps it only when it is a pseudo-terminal
// slave.
func openPTY(p string) (*os.File, error) {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_NOCTTY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: opening %s: %w", wire.OpLibvirtConsole, p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %s: %w", wire.OpLibvirtConsole, p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) < ptyMajorFirst || unix.Major(st.Rdev) > ptyMajorLast {
		unix.Close(fd)
		return nil, refuse("%s: %s is not a pseudo-terminal slave", wire.OpLibvirtConsole, p)
	}
	return os.NewFile(uintptr(fd), p), nil
}

func clipOut(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}
