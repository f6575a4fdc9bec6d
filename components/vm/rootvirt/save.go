package rootvirt

import (
	"context"
	"encoding/binary"
	"encoding/json"
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

// libvirt's save image header (qemu_saveimage.h): the magic, then
// version, data_len, was_running, compressed and cookieOffset and 14
// unused 32-bit words, in the host's byte order; data_len bytes of
// domain XML (and a cookie) follow, then QEMU's migration stream.
const (
	saveMagic     = "LibvirtQemudSave"
	saveHeaderLen = 16 + 19*4
	maxSaveData   = 16 << 20
	qemuMagic     = "QEVM"
)

// Restore resumes instance id's defined, stopped domain from the saved
// memory in its directory (MemoryFile, the node's file). The node's
// file gives only QEMU's migration stream: root renders the domain
// itself from the verified section (as libvirt.define) and writes a
// save image of its own (its header, its XML, the stream copied from the
// checked file) into its staging directory, which libvirtd restores. A
// memory of another shape fails in QEMU, final.
func (Ops) Restore(ctx context.Context, h helper.LibvirtHost, id string, body []byte) (bool, error) {
	return result(restore(ctx, h, id, body))
}

func restore(ctx context.Context, h helper.LibvirtHost, id string, body []byte) error {
	staged, err := stagedSave(h, id)
	if err != nil {
		return err
	}
	var sec section
	if err := json.Unmarshal(body, &sec); err != nil {
		return refuse("the instances section: %v", err)
	}
	memory := false
	for _, in := range sec.Instances {
		if in.ID == id && in.RestoreFrom != nil {
			memory = in.RestoreFrom.Memory
		}
	}
	if !memory {
		return refuse("the signed instances section does not restore instance %s from a memory snapshot", id)
	}
	xml, found, err := render(ctx, h, id, body)
	if err != nil {
		return err
	}
	if !found {
		return refuse("restore %s: define the domain first", id)
	}
	out, err := h.Virsh(ctx, nil, "domstate", id)
	if err != nil {
		return err
	}
	if st := strings.TrimSpace(string(out)); st != "shut off" {
		return refuse("restore %s: the domain is %s; memory resumes only into a stopped domain", id, st)
	}
	f, err := openNodeFile(filepath.Join(h.DataDir, "instances", id, MemoryFile), h.Owner)
	if err != nil {
		return err
	}
	defer f.Close()
	stream, err := migrationStream(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(h.Staging, 0o700); err != nil {
		return err
	}
	image := staged + ".restore"
	if err := writeSaveImage(image, xml, f, stream); err != nil {
		os.Remove(image)
		return err
	}
	defer os.Remove(image)
	if _, err := h.Virsh(ctx, nil, "restore", image); err != nil {
		return refuse("restore %s: %v", id, err)
	}
	return nil
}

// migrationStream checks the node's save image header (libvirt's magic,
// version 2, uncompressed, bounded XML) and returns where QEMU's stream
// starts; it must start with QEMU's magic.
func migrationStream(f *os.File) (int64, error) {
	hdr := make([]byte, saveHeaderLen)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return 0, refuse("memory file: %v", err)
	}
	le := binary.LittleEndian
	switch {
	case string(hdr[:16]) != saveMagic:
		return 0, refuse("memory file is not a libvirt save image")
	case le.Uint32(hdr[16:]) != 2:
		return 0, refuse("memory file: save image version %d; root reads 2", le.Uint32(hdr[16:]))
	case le.Uint32(hdr[20:]) > maxSaveData:
		return 0, refuse("memory file: %d bytes of definition; at most %d", le.Uint32(hdr[20:]), maxSaveData)
	case le.Uint32(hdr[28:]) != 0:
		return 0, refuse("memory file: a compressed save image is not restored")
	}
	start := int64(saveHeaderLen) + int64(le.Uint32(hdr[20:]))
	magic := make([]byte, 4)
	if _, err := f.ReadAt(magic, start); err != nil || string(magic) != qemuMagic {
		return 0, refuse("memory file: no QEMU migration stream where its header says")
	}
	return start, nil
}

// writeSaveImage writes root's own save image: its header, xml, and the
// stream of f from start.
func writeSaveImage(path string, xml []byte, f *os.File, start int64) error {
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	hdr := make([]byte, saveHeaderLen)
	copy(hdr, saveMagic)
	le := binary.LittleEndian
	le.PutUint32(hdr[16:], 2)
	le.PutUint32(hdr[20:], uint32(len(xml)+1))
	le.PutUint32(hdr[24:], 1) // was running
	if _, err := out.Write(append(append(hdr, xml...), 0)); err != nil {
		return err
	}
	if _, err := io.Copy(out, io.NewSectionReader(f, start, 1<<62)); err != nil {
		return fmt.Errorf("copying the memory: %w", err)
	}
	return out.Sync()
}

// openNodeFile opens path with no symlink on the way and checks it is a
// regular file of owner with one link.
func openNodeFile(path string, owner uint32) (*os.File, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, refuse("%s: %v", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != owner || st.Nlink != 1 {
		f.Close()
		return nil, refuse("%s is not a regular file of the node's uid %d with one link", path, owner)
	}
	return f, nil
}
