package bcx

import (
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// filterChild loads the plugin filter and tries what it denies, as root:
// only the filter stands in the way.
func filterChild() int {
	runtime.LockOSThread()
	if err := seccomp.LoadFilter(filter()); err != nil {
		fmt.Println("load:", err)
		return 1
	}
	try := func(name string, err error) { fmt.Printf("%s=%v\n", name, err) }
	try("unshare", unix.Unshare(unix.CLONE_NEWUTS))
	try("mount", unix.Mount("none", os.TempDir(), "tmpfs", 0, ""))
	_, _, e := unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_NEWNET, 0, 0)
	try("clone", e)
	try("delete_module", unix.DeleteModule("bcx_no_such_module", 0))
	try("getpid", nil)
	return 0
}

// TestFilterBindsRoot: with the filter loaded even root cannot make
// namespaces, mount or unload modules (the plugins normally also lose root).
func TestFilterBindsRoot(t *testing.T) {
	testenv.NeedRoot(t, "to show the filter, not missing privileges, refuses")
	out, err := exec.Command("/proc/self/exe", "__bcx-filtertest").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"unshare=operation not permitted", "mount=operation not permitted", "clone=operation not permitted",
		"delete_module=operation not permitted", "getpid=<nil>"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("want %s in:\n%s", want, out)
		}
	}
}
