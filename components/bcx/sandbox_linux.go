package bcx

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"syscall"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// maxPluginSize bounds a plugin binary.
const maxPluginSize = 512 << 20

// hashedCopy copies the plugin at path into a sealed memfd while hashing
// it, and returns the memfd only when the hash is the pin: the process the
// shim starts runs these bytes, whatever happens to path afterwards.
func hashedCopy(path string, pin [32]byte) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxPluginSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxPluginSize)
	}
	name := "bcx:" + st.Name()
	mfd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // kernels before 6.3 know no MFD_EXEC
		mfd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create(%q) = %w", name, err)
	}
	m := os.NewFile(uintptr(mfd), name)
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(m, h), io.LimitReader(f, maxPluginSize+1))
	if err == nil && n > maxPluginSize {
		err = fmt.Errorf("larger than %d bytes", maxPluginSize)
	}
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("copy %s: %w", path, err)
	}
	var got [32]byte
	h.Sum(got[:0])
	if got != pin {
		m.Close()
		return nil, fmt.Errorf("%s hashes to %s: %w", st.Name(), hex.EncodeToString(got[:]), ErrPinMismatch)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(m.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		m.Close()
		return nil, fmt.Errorf("fcntl(F_ADD_SEALS) on %s = %w", name, err)
	}
	return m, nil
}

// deniedSyscalls fail with EPERM in a plugin: debugging or reading other
// processes, mounts and namespaces, kernel modules and kexec, BPF and perf,
// keyrings, io_uring, swap, reboot and the clock.
var deniedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
	"mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"unshare", "setns",
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open", "userfaultfd",
	"add_key", "request_key", "keyctl",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"swapon", "swapoff", "reboot", "acct", "quotactl",
	"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"iopl", "ioperm", "open_by_handle_at", "name_to_handle_at", "syslog", "vhangup",
}

// namespaceFlags are clone(2) flags that make new namespaces.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// filter is the plugin's seccomp filter: everything not denied is allowed;
// clone with a namespace flag is EPERM, and clone3 (whose flags a filter
// cannot read) is ENOSYS, so C libraries fall back to clone.
func filter() seccomp.Filter {
	return seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls: []seccomp.SyscallGroup{
				{Action: seccomp.ActionErrno, Names: deniedSyscalls},
				{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
					Name:       "clone",
					Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: namespaceFlags}},
				}}},
				{Action: seccomp.Action(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)), Names: []string{"clone3"}},
			},
		},
	}
}

// ShimName is the hidden subcommand bcd re-executes itself as to start a
// plugin: bcd __bcx-exec [--uid N --gid N] NAME, with the sealed plugin
// binary on fd 3.
const ShimName = "__bcx-exec"

// Shim is __bcx-exec: it drops to the given uid and gid (when set), asks
// to be killed with its parent, sets no_new_privs, loads the seccomp filter
// on every thread, and executes the plugin from fd 3. It returns only on
// failure, with the exit code.
func Shim(args []string, stderr io.Writer) int {
	uid, gid := -1, -1
	for len(args) > 1 && (args[0] == "--uid" || args[0] == "--gid") {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 0 {
			fmt.Fprintf(stderr, "bcd %s: %s must be a non-negative number\n", ShimName, args[0])
			return 2
		}
		if args[0] == "--uid" {
			uid = n
		} else {
			gid = n
		}
		args = args[2:]
	}
	if len(args) != 1 || (uid < 0) != (gid < 0) {
		fmt.Fprintf(stderr, "usage: bcd %s [--uid N --gid N] NAME (bcd starts this itself; fd 3 is the plugin)\n", ShimName)
		return 2
	}
	fail := func(what string, err error) int {
		fmt.Fprintf(stderr, "bcd %s %s: %s: %v\n", ShimName, args[0], what, err)
		return 1
	}
	runtime.LockOSThread() // the filter and no_new_privs are set on the thread that execs
	ppid := os.Getppid()
	if uid >= 0 {
		if err := syscall.Setgroups([]int{}); err != nil {
			return fail("setgroups([])", err)
		}
		if err := syscall.Setresgid(gid, gid, gid); err != nil {
			return fail(fmt.Sprintf("setresgid(%d)", gid), err)
		}
		if err := syscall.Setresuid(uid, uid, uid); err != nil {
			return fail(fmt.Sprintf("setresuid(%d)", uid), err)
		}
	}
	// A change of credentials clears the parent-death signal: set it again,
	// then make sure the parent did not go in between.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fail("prctl(PR_SET_PDEATHSIG)", err)
	}
	if os.Getppid() != ppid {
		return fail("parent", errors.New("bcd went away"))
	}
	if err := seccomp.LoadFilter(filter()); err != nil {
		return fail("seccomp", err)
	}
	if _, err := unix.FcntlInt(3, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fail("fd 3", err)
	}
	err := syscall.Exec("/proc/self/fd/3", []string{args[0]}, os.Environ())
	return fail("execve(/proc/self/fd/3)", err)
}

// sandboxSupported says the host can start plugins here.
const sandboxSupported = true
