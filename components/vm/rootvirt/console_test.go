package rootvirt

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/vm/domainxml"
)

// pollable is f as the node makes it (a non-blocking descriptor the
// runtime's poller serves, so reads take deadlines); f is closed.
func pollable(t *testing.T, f *os.File) *os.File {
	t.Helper()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	must(t, unix.SetNonblock(fd, true))
	return os.NewFile(uintptr(fd), "console")
}

// readUntil reads f until what it read holds want or 60 s passed.
func readUntil(t *testing.T, f *os.File, want string) string {
	t.Helper()
	var got strings.Builder
	buf := make([]byte, 4096)
	end := time.Now().Add(60 * time.Second)
	for time.Now().Before(end) && !strings.Contains(got.String(), want) {
		f.SetReadDeadline(time.Now().Add(time.Second))
		n, _ := f.Read(buf)
		got.Write(buf[:n])
	}
	return got.String()
}

// TestConsole: the serial console of a running domain of bcd's, opened
// as root from the pty libvirt reports, is a pseudo-terminal slave that
// carries what the guest's firmware prints (SeaBIOS, with no VGA, on the
// serial port); a stopped domain, a domain defined by hand and no domain
// have none.
func TestConsole(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.instance(t, "vm-c")
	must(t, func() error { _, err := (Ops{}).Define(ctx, e.host, "vm-c", e.section("", "vm-c")); return err }())
	if _, final, err := (Ops{}).Console(ctx, e.host, "vm-c"); err == nil || !final || !strings.Contains(err.Error(), "only a running (or paused) instance") {
		t.Fatalf("console of a stopped domain = %v, %v", final, err)
	}
	// Started paused, so the console is open before the firmware prints.
	e.virsh(t, "start", "--paused", "vm-c")
	f, final, err := (Ops{}).Console(ctx, e.host, "vm-c")
	if err != nil {
		t.Fatalf("Console = %v (final %v)", err, final)
	}
	f2 := pollable(t, f)
	defer f2.Close()
	must(t, func() error { _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtResume, "vm-c"); return err }())
	got := readUntil(t, f2, "SeaBIOS")
	t.Logf("console %s read:\n%q", f.Name(), got)
	if !strings.Contains(got, "SeaBIOS") {
		t.Fatalf("the console carried %q, no SeaBIOS banner", got)
	}
	f2.Close()

	// Typing: a domain of bcd's (its metadata) with SeaBIOS's boot menu
	// on the serial port; ESC typed into the console opens the menu.
	xml := filepath.Join(e.d.Dir, "menu.xml")
	must(t, os.WriteFile(xml, []byte(`<domain type="`+e.host.Accel+`"><name>vm-m</name><memory unit="MiB">64</memory>
<metadata><bcd:instance xmlns:bcd="`+domainxml.Namespace+`" id="vm-m"/></metadata>
<os><type arch="x86_64" machine="q35">hvm</type><bootmenu enable="yes" timeout="20000"/><bios useserial="yes"/></os>
<devices><serial type="pty"><target port="0"/></serial><console type="pty"><target type="serial" port="0"/></console></devices></domain>`), 0o600))
	e.virsh(t, "define", xml)
	e.virsh(t, "start", "--paused", "vm-m")
	m, _, err := (Ops{}).Console(ctx, e.host, "vm-m")
	if err != nil {
		t.Fatal(err)
	}
	m2 := pollable(t, m)
	defer m2.Close()
	e.virsh(t, "resume", "vm-m")
	if got := readUntil(t, m2, "Press ESC for boot menu"); !strings.Contains(got, "Press ESC") {
		t.Fatalf("no boot menu prompt: %q", got)
	}
	if _, err := m2.Write([]byte("\x1b")); err != nil {
		t.Fatal(err)
	}
	if got := readUntil(t, m2, "Select boot device"); !strings.Contains(got, "Select boot device") {
		t.Fatalf("ESC typed into the console opened no menu: %q", got)
	}

	// None for a domain defined by hand, nor for no domain.
	byhand := filepath.Join(e.d.Dir, "byhand.xml")
	must(t, os.WriteFile(byhand, []byte(`<domain type="`+e.host.Accel+`"><name>byhand</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os>
<devices><serial type="pty"><target port="0"/></serial></devices></domain>`), 0o600))
	e.virsh(t, "define", byhand)
	e.virsh(t, "start", "byhand")
	for id, want := range map[string]string{"byhand": "never touched", "vm-none": "no such domain"} {
		if _, final, err := (Ops{}).Console(ctx, e.host, id); err == nil || !final || !strings.Contains(err.Error(), want) {
			t.Errorf("console of %s = %v, %v; want a final %q", id, final, err, want)
		}
	}
}

// TestOpenPTY: only a pseudo-terminal slave opens; a regular file, a
// directory, /dev/null and a symlink to a pty do not.
func TestOpenPTY(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	must(t, os.WriteFile(plain, nil, 0o600))
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	must(t, unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts := "/dev/pts/" + strconv.Itoa(n)
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(pts, link))
	f, err := openPTY(pts)
	if err != nil {
		t.Fatalf("openPTY(%s) = %v", pts, err)
	}
	f.Close()
	for _, p := range []string{plain, dir, "/dev/null", link, "/dev/ptmx"} {
		if f, err := openPTY(p); err == nil {
			f.Close()
			t.Errorf("openPTY(%s) opened it", p)
		}
	}
	for p, ok := range map[string]bool{"/dev/pts/0": true, "/dev/pts/12": true, "/dev/pts/": false, "/dev/pts/../tty": false,
		"/dev/pts/1a": false, "/dev/tty1": false, "/dev/pts/0/x": false} {
		if ptsPath(p) != ok {
			t.Errorf("ptsPath(%q) = %v", p, !ok)
		}
	}
}
