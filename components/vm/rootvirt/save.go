package rootvirt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper"
)

// MemoryFile is the saved memory state libvirt.save hands to the node,
// in the instance's directory.
const MemoryFile = "memory.save"

// stagedSave is root's own saved state of domain id: libvirt.start
// resumes from it while it is there.
func stagedSave(h helper.LibvirtHost, id string) (string, error) {
	if !filepath.IsAbs(h.Staging) {
		return "", refuse("root has no staging directory for saved memory ([helper] state_dir)")
	}
	return filepath.Join(h.Staging, id+".save"), nil
}

// save saves domain id's memory (running or paused) into root's staging
// directory, which stops the domain, then copies the state into the
// instance's directory as the node's file (0640). The disk is quiet
// until libvirt.start resumes the domain from root's own copy.
func save(ctx context.Context, h helper.LibvirtHost, id string) error {
	staged, err := stagedSave(h, id)
	if err != nil {
		return err
	}
	out, err := h.Virsh(ctx, nil, "domstate", id)
	if err != nil {
		return err
	}
	if st := strings.TrimSpace(string(out)); st != "running" && st != "paused" {
		return refuse("save %s: the domain is %s; only a running or paused domain has memory to save", id, st)
	}
	if err := os.MkdirAll(h.Staging, 0o700); err != nil {
		return fmt.Errorf("save %s: %w", id, err)
	}
	part := staged + ".part"
	os.Remove(part)
	if _, err := h.Virsh(ctx, nil, "save", id, part); err != nil {
		os.Remove(part)
		return err
	}
	if err := os.Rename(part, staged); err != nil {
		return fmt.Errorf("save %s: %w", id, err)
	}
	return handOver(staged, filepath.Join(h.DataDir, "instances", id), h.Owner)
}

// handOver copies root's file src into dir (the instance's directory,
// reached with no symlink on the way, the node's) as MemoryFile, a new
// file of owner, mode 0640: whatever the node left under that name is
// unlinked first, and the new one is created exclusively, never
// following a link.
func handOver(src, dir string, owner uint32) error {
	dfd, err := unix.Openat2(unix.AT_FDCWD, dir, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return refuse("instance directory %s: %v", dir, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return err
	}
	if st.Uid != owner {
		return refuse("instance directory %s belongs to uid %d, not the node's %d", dir, st.Uid, owner)
	}
	if err := unix.Unlinkat(dfd, MemoryFile, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s/%s: %w", dir, MemoryFile, err)
	}
	fd, err := unix.Openat(dfd, MemoryFile, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s/%s: %w", dir, MemoryFile, err)
	}
	dst := os.NewFile(uintptr(fd), dir+"/"+MemoryFile)
	defer dst.Close()
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if _, err := io.Copy(dst, in); err != nil {
		return fmt.Errorf("copying the saved memory to %s: %w", dir, err)
	}
	if err := dst.Sync(); err != nil {
		return err
	}
	if err := unix.Fchown(fd, int(owner), -1); err != nil {
		return err
	}
	return unix.Fchmod(fd, 0o640)
}

// resumeSaved resumes domain id from root's saved state, when there is
// one (its disks checked by the caller), and removes the state: a domain
// saved for a snapshot comes back as it was, not booted again.
func resumeSaved(ctx context.Context, h helper.LibvirtHost, id string) (bool, error) {
	staged, err := stagedSave(h, id)
	if err != nil {
		return false, nil
	}
	if _, err := os.Lstat(staged); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if _, err := h.Virsh(ctx, nil, "restore", staged); err != nil {
		return true, err
	}
	return true, os.Remove(staged)
}

// dropSaved forgets root's saved state of domain id: a domain powered
// off or undefined does not resume from it.
func dropSaved(h helper.LibvirtHost, id string) {
	if staged, err := stagedSave(h, id); err == nil {
		os.Remove(staged)
	}
}
