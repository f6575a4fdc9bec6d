//go:build linux

package helper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/wire"
)

// Where slice drop-ins live: systemd's runtime unit directory, which is
// also how a host shows systemd runs (sd_booted).
const (
	unitDir    = "/run/systemd/system"
	dropinName = wire.SliceDropinName
)

// errNoSystemd is slices on a host systemd does not run.
var errNoSystemd = errors.New("systemd is not running on this host (no " + unitDir + "); allocation slices need it")

// dropinTarget is the drop-in of a slice, written and removed through the
// same walker as the file table's files (never a path a caller names).
func dropinTarget(slice string) filetable.Target {
	return filetable.Target{Kind: "slice-dropin", ID: slice, Dir: unitDir + "/" + slice + ".d", Name: dropinName, Mode: 0o644}
}

// sliceApply confines an allocation's slice to CPUs and memory nodes of
// this host: it writes the slice's drop-in with AllowedCPUs and
// AllowedMemoryNodes, reloads systemd and starts the slice. Lists that
// name a CPU or node the host does not have are refused before anything
// changes. A fakehw build checks against its fake machine and only logs.
func (srv *server) sliceApply(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	cpus, mems, err := srv.s.topology()
	if err != nil {
		return failed(fmt.Errorf("slice.apply: reading this host's CPUs and memory nodes: %w", err), false)
	}
	if err := within(req.CPUs, cpus, "CPU", "online CPUs"); err != nil {
		return refused(fmt.Errorf("slice.apply: cpus: %w", err))
	}
	if err := within(req.Mems, mems, "memory node", "memory nodes"); err != nil {
		return refused(fmt.Errorf("slice.apply: mems: %w", err))
	}
	if srv.s.fakeHW {
		srv.log.Info("helper: slice.apply (a fakehw build only logs it)", "slice", req.Slice, "cpus", req.CPUs, "mems", req.Mems, "memory_max", req.MemoryMax)
		return ok()
	}
	if err := srv.systemdRuns(); err != nil {
		return failed(fmt.Errorf("slice.apply: %w", err), false)
	}
	t := dropinTarget(req.Slice)
	if err := writeFile(srv.s.unitRoot, t, renderDropin(req), srv.s.euid); err != nil {
		err = fmt.Errorf("slice.apply %s: %w", t.Path(), err)
		var r *refusal
		if errors.As(err, &r) {
			return refused(err)
		}
		return failed(err, true)
	}
	for _, args := range [][]string{{"daemon-reload"}, {"start", req.Slice}} {
		if _, err := srv.s.systemctl(ctx, args...); err != nil {
			return failed(fmt.Errorf("slice.apply: %w", err), !errors.Is(err, errNoSystemctl))
		}
	}
	return ok()
}

// sliceRemove stops an allocation's slice once it is empty and removes
// its drop-in. A slice that still holds a process is refused (retryable:
// the node asks again once its workload ended); one that is not there is
// success.
func (srv *server) sliceRemove(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	if srv.s.fakeHW {
		srv.log.Info("helper: slice.remove (a fakehw build only logs it)", "slice", req.Slice)
		return ok()
	}
	if err := srv.systemdRuns(); err != nil {
		return failed(fmt.Errorf("slice.remove: %w", err), false)
	}
	populated, err := wire.SlicePopulated(srv.s.cgroup, req.Slice)
	if err != nil {
		return failed(fmt.Errorf("slice.remove: %w", err), true)
	}
	if populated {
		return wire.Failed(fmt.Sprintf("slice.remove: %s still has processes; it is stopped only once empty", req.Slice), true), "refused"
	}
	state, err := srv.s.systemctl(ctx, "show", "--property=ActiveState", "--value", req.Slice)
	if err != nil {
		return failed(fmt.Errorf("slice.remove: %w", err), !errors.Is(err, errNoSystemctl))
	}
	if trimmed(state) != "inactive" {
		if _, err := srv.s.systemctl(ctx, "stop", req.Slice); err != nil {
			return failed(fmt.Errorf("slice.remove: %w", err), true)
		}
	}
	t := dropinTarget(req.Slice)
	absent, err := removeFile(srv.s.unitRoot, t, srv.s.euid)
	if err == nil {
		err = removeEmptyDir(srv.s.unitRoot, unitDir, req.Slice+".d", srv.s.euid)
	}
	if err != nil {
		err = fmt.Errorf("slice.remove %s: %w", t.Path(), err)
		var r *refusal
		if errors.As(err, &r) {
			return refused(err)
		}
		return failed(err, true)
	}
	if !absent {
		if _, err := srv.s.systemctl(ctx, "daemon-reload"); err != nil {
			return failed(fmt.Errorf("slice.remove: %w", err), true)
		}
		return ok()
	}
	return &wire.Response{OK: true}, "absent"
}

// systemdRuns requires unitDir under the unit root to be a directory, as
// sd_booted does.
func (srv *server) systemdRuns() error {
	fi, err := os.Lstat(filepath.Join(srv.s.unitRoot, unitDir))
	if err != nil || !fi.IsDir() {
		return errNoSystemd
	}
	return nil
}

// renderDropin is the slice's drop-in: only what the request set.
func renderDropin(req *wire.Request) []byte {
	return wire.SliceDropin(req.CPUs, req.Mems, req.MemoryMax)
}

// within checks that every number of list (a cpulist; "" passes) is in
// host's cpulist.
func within(list, host, what, whose string) error {
	if list == "" {
		return nil
	}
	want, err := wire.ParseCPUList(list)
	if err != nil {
		return err
	}
	have, err := wire.ParseCPUList(host)
	if err != nil {
		return fmt.Errorf("this host's %s %q: %w", whose, host, err)
	}
	set := make(map[int]bool, len(have))
	for _, n := range have {
		set[n] = true
	}
	for _, n := range want {
		if !set[n] {
			return fmt.Errorf("%s %d is not one of this host's %s (%s)", what, n, whose, host)
		}
	}
	return nil
}

// hostTopology reads the host's online CPUs and its memory nodes (those
// with memory, else those online; a kernel without NUMA has node 0) from
// sys, the sysfs mount.
func hostTopology(sys string) (cpus, mems string, err error) {
	b, err := os.ReadFile(filepath.Join(sys, "devices/system/cpu/online"))
	if err != nil {
		return "", "", err
	}
	cpus = strings.TrimSpace(string(b))
	mems = "0"
	for _, f := range []string{"devices/system/node/has_memory", "devices/system/node/online"} {
		b, err := os.ReadFile(filepath.Join(sys, f))
		if err == nil {
			mems = strings.TrimSpace(string(b))
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
	}
	return cpus, mems, nil
}

// removeEmptyDir removes dir/name under root when it is an empty
// directory; a missing or non-empty one is left as it is.
func removeEmptyDir(root, dir, name string, owner int) error {
	dfd, missing, err := openDir(root, dir, owner, false)
	if err != nil || missing {
		return err
	}
	defer unix.Close(dfd)
	err = unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("rmdir %s/%s: %w", dir, name, err)
}
