//go:build linux

package helper

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/trust/selfupdate"
)

// peerCred is what SO_PEERCRED says of the process that connected.
type peerCred struct {
	pid      int32
	uid, gid uint32
	exe      os.FileInfo // the binary it runs, once checkPeer read it
}

// socketPeer reads SO_PEERCRED of c.
func socketPeer(c *net.UnixConn) (peerCred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return peerCred{}, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return peerCred{}, err
	}
	if serr != nil {
		return peerCred{}, fmt.Errorf("getsockopt SO_PEERCRED: %w", serr)
	}
	return peerCred{pid: cred.Pid, uid: cred.Uid, gid: cred.Gid}, nil
}

// peerExe stats /proc/PID/exe of the process that connected on c. Where
// the kernel has SO_PEERPIDFD (Linux 6.5), it also makes sure that process
// was still alive after the stat, so the pid was not reused by another
// process in between.
func peerExe(c *net.UnixConn, pid int32) (os.FileInfo, error) {
	pidfd := -1
	if raw, err := c.SyscallConn(); err == nil {
		raw.Control(func(fd uintptr) {
			if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
				pidfd = v
			}
		})
	}
	if pidfd >= 0 {
		defer unix.Close(pidfd)
	}
	fi, err := os.Stat("/proc/" + strconv.Itoa(int(pid)) + "/exe")
	if err != nil {
		return nil, err
	}
	if pidfd >= 0 {
		if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
			return nil, fmt.Errorf("the caller exited while it was checked: %w", err)
		}
	}
	return fi, nil
}

// checkPeer checks the caller on c: its uid and gid must be the [helper]
// user's (the gid its primary group), or its uid 0; and the binary it runs
// must be this helper's own, [helper] entrypoint's, or one of the
// self-update slots' (bcd-a, bcd-b in the helper's slots directory, which
// only the helper writes: the node runs from current, and the binary it
// ran before a swap is the other slot until it restarts). It returns the
// reason it refused, or "".
func (srv *server) checkPeer(c *net.UnixConn) (peerCred, string) {
	p, err := srv.s.peer(c)
	if err != nil {
		return p, err.Error()
	}
	if p.uid != 0 && (p.uid != srv.uid || p.gid != srv.gid) {
		return p, fmt.Sprintf("uid %d gid %d is neither %s (uid %d gid %d) nor root", p.uid, p.gid, srv.cfg.User, srv.uid, srv.gid)
	}
	exe, err := srv.s.exe(c, p.pid)
	if err != nil {
		return p, fmt.Sprintf("reading /proc/%d/exe: %v", p.pid, err)
	}
	p.exe = exe
	if os.SameFile(exe, srv.self) {
		return p, ""
	}
	if srv.upd != nil {
		for _, slot := range []string{selfupdate.SlotA, selfupdate.SlotB} {
			fi, err := os.Lstat(filepath.Join(srv.upd.Slots.Dir, slot))
			if err == nil && fi.Mode().IsRegular() && os.SameFile(exe, fi) {
				return p, ""
			}
		}
	}
	if srv.cfg.Entrypoint != "" {
		ep, err := os.Stat(srv.cfg.Entrypoint)
		if err == nil && os.SameFile(exe, ep) {
			return p, ""
		}
	}
	return p, fmt.Sprintf("/proc/%d/exe is not bcd (neither this helper's binary, [helper] entrypoint nor a self-update slot)", p.pid)
}

var errNoNft = errors.New("nft is not installed on this host (looked in /usr/sbin, /sbin, /usr/bin and /bin)")

// ownedBy reports whether fi (from os.Stat or os.Lstat) belongs to uid.
func ownedBy(fi os.FileInfo, uid int) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == uid
}
