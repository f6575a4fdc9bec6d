package devices

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
)

// Slices keeps the cgroup slices of holds with limits
// (bcd-alloc-<allocation>.slice, systemd's), by allocation id.
type Slices interface {
	// Current is the drop-in the slice of id runs with now; nil when it
	// has none.
	Current(id string) ([]byte, error)
	// List returns the allocation ids with a slice drop-in.
	List() ([]string, error)
	// Apply confines the slice of id to cpus and memoryMax bytes and
	// starts it.
	Apply(ctx context.Context, id, cpus string, memoryMax uint64) error
	// Remove stops the slice of id once it is empty and removes its
	// drop-in; a slice that still holds processes is an error (retried).
	Remove(ctx context.Context, id string) error
}

// DirSlices keeps slice drop-ins under Root + /run/systemd/system: "/"
// on a host systemd runs, a directory of its own in a fakehw build and
// in tests. Reads always go here (the drop-ins are world-readable);
// writes go through bcd helper when Helper is set, else they are written
// here and Systemctl is run (daemon-reload, start, stop).
type DirSlices struct {
	Root string
	// Cgroup is the cgroup v2 mount a root node reads a slice's
	// processes from: /sys/fs/cgroup when "".
	Cgroup string
	Helper *helperclient.Client
	// Systemctl runs systemctl; nil: the real one.
	Systemctl func(ctx context.Context, args ...string) error
}

// HostSlices returns the slices of a host where systemd runs as PID 1
// (/run/systemd/system is a directory, as sd_booted checks), nil where it
// does not: holds with limits then fail, naming why.
func HostSlices(helper *helperclient.Client) Slices {
	if fi, err := os.Stat("/run/systemd/system"); err != nil || !fi.IsDir() {
		return nil
	}
	return DirSlices{Root: "/", Helper: helper}
}

func (d DirSlices) dropin(id string) string {
	slice := wire.SliceName(id)
	return filepath.Join(d.Root, wire.SliceDropinDir(slice), wire.SliceDropinName)
}

// Current reads the drop-in back.
func (d DirSlices) Current(id string) ([]byte, error) {
	b, err := os.ReadFile(d.dropin(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// List finds bcd-alloc-*.slice.d/50-bcd.conf.
func (d DirSlices) List() ([]string, error) {
	dir := filepath.Join(d.Root, "/run/systemd/system")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		id, err := wire.SliceID(strings.TrimSuffix(e.Name(), ".d"))
		if err != nil || !strings.HasSuffix(e.Name(), ".slice.d") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, e.Name(), wire.SliceDropinName)); err == nil {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (d DirSlices) systemctl(ctx context.Context, args ...string) error {
	if d.Systemctl != nil {
		return d.Systemctl(ctx, args...)
	}
	out, err := exec.CommandContext(ctx, "systemctl", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl %s = %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Apply writes the drop-in, reloads systemd and starts the slice.
func (d DirSlices) Apply(ctx context.Context, id, cpus string, memoryMax uint64) error {
	if d.Helper != nil {
		return d.Helper.ApplySlice(ctx, id, cpus, "", memoryMax)
	}
	p := d.dropin(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", filepath.Dir(p), err)
	}
	if err := atomicfile.Write(p, wire.SliceDropin(cpus, "", memoryMax), 0o644); err != nil {
		return err
	}
	if err := d.systemctl(ctx, "daemon-reload"); err != nil {
		return err
	}
	return d.systemctl(ctx, "start", wire.SliceName(id))
}

// Remove stops the slice once it is empty and removes its drop-in. A
// slice with processes in it is left alone (stopping it would kill the
// workload) and asked again at the next pass.
func (d DirSlices) Remove(ctx context.Context, id string) error {
	if d.Helper != nil {
		return d.Helper.RemoveSlice(ctx, id)
	}
	cg := d.Cgroup
	if cg == "" {
		cg = "/sys/fs/cgroup"
	}
	populated, err := wire.SlicePopulated(cg, wire.SliceName(id))
	if err != nil {
		return err
	}
	if populated {
		return fmt.Errorf("%s still has processes; it is stopped only once empty", wire.SliceName(id))
	}
	if err := d.systemctl(ctx, "stop", wire.SliceName(id)); err != nil {
		return err
	}
	p := d.dropin(id)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_ = os.Remove(filepath.Dir(p)) // only when empty
	return d.systemctl(ctx, "daemon-reload")
}

// HostMIGCaps reads the host's nvidia-caps table; a host without the
// nvidia-caps driver has an empty one (its MIG instances, if any, cannot
// be held).
func HostMIGCaps() (cdispec.MIGCaps, error) {
	b, err := os.ReadFile(cdispec.MIGMinorsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return cdispec.MIGCaps{}, nil
	}
	if err != nil {
		return nil, err
	}
	return cdispec.ParseMIGCaps(b)
}
