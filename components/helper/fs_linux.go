//go:build linux

package helper

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/filetable"
)

// refusal is a file operation the helper will not do (a symlink, a
// directory others can write), as opposed to one that failed.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refuse(format string, a ...any) error { return &refusal{msg: fmt.Sprintf(format, a...)} }

// openDir opens dir (absolute and clean) by walking down from root one
// component at a time, each opened relative to its parent with O_NOFOLLOW:
// a symlink or a non-directory anywhere on the way is refused, and so is
// a directory that owner does not own or that group or others can write
// (root itself included). With create, a missing directory is created
// 0755; without, a missing one gives missing = true.
func openDir(root, dir string, owner int, create bool) (fd int, missing bool, err error) {
	fd, err = unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("open %s: %w", root, err)
	}
	if err := checkDirFd(fd, root, owner); err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	at := strings.TrimSuffix(root, "/")
	for _, name := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		if name == "" {
			continue
		}
		if name == "." || name == ".." {
			unix.Close(fd)
			return -1, false, refuse("%s: %q on the way", dir, name)
		}
		at = at + "/" + name
		next, err := openChild(fd, name, at)
		if errors.Is(err, unix.ENOENT) {
			if !create {
				unix.Close(fd)
				return -1, true, nil
			}
			if err := unix.Mkdirat(fd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, false, fmt.Errorf("mkdir %s: %w", at, err)
			}
			if next, err = openChild(fd, name, at); err == nil {
				err = unix.Fchmod(next, 0o755) // whatever the umask
				if err != nil {
					unix.Close(next)
					err = fmt.Errorf("chmod %s 0755: %w", at, err)
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, false, err
		}
		if err := checkDirFd(next, at, owner); err != nil {
			unix.Close(next)
			return -1, false, err
		}
		fd = next
	}
	return fd, false, nil
}

// openChild opens the directory name in dirfd without following a
// symlink, and says which of a symlink or a non-directory it found.
func openChild(dirfd int, name, at string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		var st unix.Stat_t
		if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, refuse("%s is a symlink", at)
		}
		return -1, refuse("%s is not a directory", at)
	}
	if errors.Is(err, unix.ENOENT) {
		return -1, err
	}
	return -1, fmt.Errorf("open %s: %w", at, err)
}

func checkDirFd(fd int, at string, owner int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", at, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return refuse("%s is not a directory", at)
	}
	if int(st.Uid) != owner {
		return refuse("%s is owned by uid %d, not %d", at, st.Uid, owner)
	}
	if st.Mode&0o022 != 0 {
		return refuse("%s can be written by group or others (mode %04o)", at, st.Mode&0o7777)
	}
	return nil
}

// targetState says whether name in dirfd is absent, or a regular file; any
// other file (a symlink planted at the target included) is refused.
func targetState(dirfd int, name, at string) (absent bool, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("stat %s: %w", at, err)
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return false, refuse("%s is a symlink", at)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return false, refuse("%s is not a regular file", at)
	}
	return false, nil
}

// tmpSeq numbers temporary files.
var tmpSeq atomic.Uint64

// writeFile writes data to t under root: it opens t's directory with
// openDir (creating what is missing), refuses anything but a regular file
// at the target, writes a temporary file created exclusively in the
// directory with t's mode, syncs it and renames it over the target, so a
// symlink planted at the target after the check is replaced, never
// followed.
func writeFile(root string, t filetable.Target, data []byte, owner int) error {
	if len(data) > filetable.MaxFileSize {
		return refuse("%d bytes is more than %d", len(data), filetable.MaxFileSize)
	}
	at := path.Join(root, t.Path())
	dfd, _, err := openDir(root, t.Dir, owner, true)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if _, err := targetState(dfd, t.Name, at); err != nil {
		return err
	}
	var tmp string
	var fd int
	for try := 0; ; try++ {
		// O_EXCL makes the name ours; the name need only rarely collide.
		tmp = "." + t.Name + ".tmp-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatUint(tmpSeq.Add(1), 36)
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(t.Mode.Perm()))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || try == 9 {
			return fmt.Errorf("create a temporary file beside %s: %w", at, err)
		}
	}
	f := os.NewFile(uintptr(fd), tmp)
	done := false
	defer func() {
		if !done {
			f.Close()
			unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if err := unix.Fchmod(fd, uint32(t.Mode.Perm())); err != nil { // whatever the umask
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	done = true
	if err := unix.Renameat(dfd, tmp, dfd, t.Name); err != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("rename to %s: %w", at, err)
	}
	unix.Fsync(dfd)
	return nil
}

// removeFile removes t under root. A missing file or directory is not an
// error (absent is true); anything but a regular file at the target is
// refused.
func removeFile(root string, t filetable.Target, owner int) (absent bool, err error) {
	at := path.Join(root, t.Path())
	dfd, missing, err := openDir(root, t.Dir, owner, false)
	if err != nil || missing {
		return missing, err
	}
	defer unix.Close(dfd)
	if absent, err := targetState(dfd, t.Name, at); err != nil || absent {
		return absent, err
	}
	if err := unix.Unlinkat(dfd, t.Name, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return true, nil
		}
		return false, fmt.Errorf("unlink %s: %w", at, err)
	}
	unix.Fsync(dfd)
	return false, nil
}
