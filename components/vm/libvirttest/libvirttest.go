// Package libvirttest starts Debian's libvirtd for one test, on its own:
// in a mount namespace of its own whose /etc/libvirt is the test's
// configuration and whose /run/libvirt, /var/lib/libvirt,
// /var/cache/libvirt and /var/log/libvirt are fresh tmpfs, with its
// sockets in the test's directory, so it neither sees nor changes the
// host's libvirt. QEMU runs as root with no security driver, cgroups or
// namespaces (a container without systemd) and, on these machines, under
// TCG: Accel says which. It needs root, libvirtd, virsh, qemu-system-x86
// and unshare. It is linked only by tests.
package libvirttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// Daemon is a running libvirtd.
type Daemon struct {
	// Dir holds its configuration, sockets and log.
	Dir   string
	sock  string
	virsh string
}

// Accel is the domain type tests use: qemu (TCG), unless
// BCD_TEST_LIBVIRT_KVM=1 and /dev/kvm opens. KVM hangs on these machines
// (docs/instances.md), so it is never required.
func Accel() string {
	if os.Getenv("BCD_TEST_LIBVIRT_KVM") == "1" {
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
			f.Close()
			return "kvm"
		}
	}
	return "qemu"
}

// startScript runs inside the new mount namespace: private tmpfs for
// libvirt's state, the test's configuration as /etc/libvirt.
const startScript = `set -e
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt; do
  mkdir -p "$d"
  mount -t tmpfs -o mode=0755 bcd-libvirttest "$d"
done
mount --bind "$1/etc" /etc/libvirt
exec "$2" --config /etc/libvirt/libvirtd.conf --pid-file "$1/libvirtd.pid"
`

// Options shape a daemon.
type Options struct {
	// ReadOnlyForAll opens the read-only socket (and the directories on
	// its way) to every account, as Debian's libvirtd does: an
	// unprivileged bcd node reads through it.
	ReadOnlyForAll bool
	// NetNS, when set, is a network namespace (ip netns's name) libvirtd
	// runs in: its domains' taps are made there, on its bridges.
	NetNS string
}

// Start starts a libvirtd for t and stops it (every domain destroyed
// first) when t ends.
func Start(t *testing.T) *Daemon { return StartWith(t, Options{}) }

// ReadOnlySocket is the daemon's read-only socket.
func (d *Daemon) ReadOnlySocket() string { return filepath.Join(d.Dir, "sock", "libvirt-sock-ro") }

// Socket is the daemon's read-write socket.
func (d *Daemon) Socket() string { return d.sock }

// StartWith starts a libvirtd for t with o.
func StartWith(t *testing.T, o Options) *Daemon {
	t.Helper()
	testenv.NeedRoot(t, "libvirtd runs as root in a mount namespace of its own")
	libvirtd := testenv.NeedTool(t, "libvirtd", "libvirt-daemon-system")
	virsh := testenv.NeedTool(t, "virsh", "libvirt-clients")
	testenv.NeedTool(t, "qemu-system-x86_64", "qemu-system-x86")
	unshare := testenv.NeedTool(t, "unshare", "util-linux")

	// A short directory: the socket paths must fit sun_path.
	dir, err := os.MkdirTemp("", "bcd-lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d := &Daemon{Dir: dir, sock: filepath.Join(dir, "sock", "libvirt-sock"), virsh: virsh}
	for _, sub := range []string{"etc", "sock"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	roPerms := "0700"
	if o.ReadOnlyForAll {
		roPerms = "0777"
		for _, d := range []string{dir, filepath.Join(dir, "sock")} {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("libvirtd.conf", fmt.Sprintf(`unix_sock_dir = %q
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = %q
auth_unix_rw = "none"
auth_unix_ro = "none"
log_outputs = "3:stderr"
`, filepath.Join(dir, "sock"), roPerms))
	// What bcd's hosts will run with too: dynamic_ownership off, so
	// libvirt never chowns a path a domain names.
	write("qemu.conf", `user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
`)
	logf, err := os.Create(filepath.Join(dir, "libvirtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{unshare, "-m", "--propagation", "private", "sh", "-c", startScript, "sh", dir, libvirtd}
	if o.NetNS != "" {
		args = append([]string{testenv.NeedTool(t, "ip", "iproute2"), "netns", "exec", o.NetNS}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start libvirtd: %v", err)
	}
	// exited is closed once libvirtd has exited, waitErr then its
	// error: both Start and the cleanup wait on it.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); logf.Close(); close(exited) }()
	t.Cleanup(func() {
		d.destroyAll()
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := d.run(context.Background(), "version"); err == nil {
			return d
		}
		select {
		case <-exited:
			t.Fatalf("libvirtd exited: %v\n%s", waitErr, d.Log())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("libvirtd did not answer on %s within 90 s\n%s", d.sock, d.Log())
		}
	}
}

// URI is the connection URI of this daemon.
func (d *Daemon) URI() string { return "qemu:///system?socket=" + d.sock }

// Log is libvirtd's log so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.Dir, "libvirtd.log"))
	return string(b)
}

func (d *Daemon) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, d.virsh, append([]string{"-q", "-c", d.URI()}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Virsh runs virsh on this daemon and returns its standard output.
func (d *Daemon) Virsh(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return d.run(t.Context(), args...)
}

// destroyAll powers off every running domain: QEMU outlives libvirtd.
func (d *Daemon) destroyAll() {
	out, err := d.run(context.Background(), "list", "--name", "--state-running", "--state-paused")
	if err != nil {
		return
	}
	for _, name := range strings.Fields(out) {
		d.run(context.Background(), "destroy", name)
	}
}
