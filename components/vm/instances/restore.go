package instances

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/vm/images"
	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/snapshot"
	"github.com/better-compute/bcd/components/vm/spec"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// restoredFile marks an instance whose memory snapshot resumed: it is
// never resumed again (a later start boots the disk as it is then).
const restoredFile = "restored"

// snapshotDir is where a snapshot's archive is unpacked.
func (s *Section) snapshotDir(digest string) string {
	if s.cfg.Snapshots == nil {
		return ""
	}
	return filepath.Join(s.cfg.Snapshots.Dir(), digest+".d")
}

// snapshot readies the snapshot r: fetched in the background like a base
// image (verified by its SHA-256, over https only, ended when it
// stalls), then unpacked once (its disk passing the base image checks).
// A refused archive stays refused while the section names it.
func (s *Section) snapshot(r spec.Restore) (snapshot.Manifest, images.Base, *failure) {
	if s.cfg.Snapshots == nil {
		return snapshot.Manifest{}, images.Base{}, fail(true, "this node keeps no snapshots: restore_from cannot be served")
	}
	dir := s.snapshotDir(r.SHA256)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		src := r.Source()
		if _, err := s.cfg.Snapshots.Ready(src); errors.Is(err, images.ErrNotFetched) {
			done, ferr := s.fetch(s.cfg.Snapshots, src)
			switch {
			case !done:
				return snapshot.Manifest{}, images.Base{}, &failure{reason: "fetching snapshot " + r.SHA256, pending: true}
			case ferr != nil:
				return snapshot.Manifest{}, images.Base{}, fail(errors.Is(ferr, images.ErrRefused), "snapshot: %v", ferr)
			}
		} else if err != nil {
			return snapshot.Manifest{}, images.Base{}, fail(false, "snapshot: %v", err)
		}
		if _, err := snapshot.Unpack(s.cfg.Snapshots.Path(src), dir); err != nil {
			refused := errors.Is(err, snapshot.ErrRefused)
			if refused {
				s.refuse(r.SHA256, err)
			}
			return snapshot.Manifest{}, images.Base{}, fail(refused, "snapshot %s: %v", r.SHA256, err)
		}
	}
	m, err := snapshot.ReadManifest(dir)
	if err != nil {
		return m, images.Base{}, fail(false, "snapshot %s: %v", r.SHA256, err)
	}
	disk := filepath.Join(dir, snapshot.DiskFile)
	h, err := qcow2.CheckFile(disk, qcow2.Backing{})
	if err != nil {
		return m, images.Base{}, fail(true, "snapshot %s: its disk as a base image: %v", r.SHA256, err)
	}
	return m, images.Base{Path: disk, VirtualSize: int64(h.VirtualSize)}, nil
}

// refuse records that a snapshot arrived and was refused, as a refused
// image's fetch is.
func (s *Section) refuse(digest string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches[digest] = &fetchResult{done: true, err: fmt.Errorf("%w: %w", images.ErrRefused, err)}
}

// resume resumes a memory snapshot into the instance's stopped domain,
// once, through a runtime that resumes memory (the shape and CPU model
// were checked before the domain was defined). It reports whether the
// domain now runs.
func (s *Section) resume(ctx context.Context, in spec.Instance, im spec.Image, m snapshot.Manifest, dir, cur string) (bool, *failure) {
	if _, err := os.Lstat(filepath.Join(dir, restoredFile)); err == nil {
		return false, nil
	}
	rt, ok := s.cfg.Runtime.(vmruntime.MemoryRestorer)
	if !ok {
		return false, fail(true, "restore_from: the %s runtime cannot resume a memory snapshot", s.cfg.Runtime.Name())
	}
	if cur != vmruntime.Stopped {
		return false, fail(true, "restore_from: the domain is %s before its memory was resumed; remove the instance and add it again", cur)
	}
	mem := filepath.Join(dir, vmruntime.MemoryFile)
	if err := copyFile(filepath.Join(s.snapshotDir(in.RestoreFrom.SHA256), snapshot.MemoryFile), mem); err != nil {
		return false, fail(false, "restore_from: %v", err)
	}
	defer os.Remove(mem)
	if err := rt.RestoreMemory(ctx, machine(in, im)); err != nil {
		return false, fail(false, "restore_from: resuming the memory: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, restoredFile), nil, 0o640); err != nil {
		return true, fail(false, "restore_from: %v", err)
	}
	return true, nil
}

// copyFile copies src to a new dst (0640, for QEMU through the node's
// group), replacing what was there.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
