package hostinfo

import (
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"

	"github.com/better-compute/bcd/components/base/buildinfo"
)

// The kernel's format: a version 4, variant 1 UUID in lower case.
var bootIDRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestNewBootIDFormat(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		id := NewBootID()
		if !bootIDRE.MatchString(id) {
			t.Fatalf("NewBootID() = %q, not in the kernel's format", id)
		}
		if seen[id] {
			t.Fatalf("NewBootID repeated %q", id)
		}
		seen[id] = true
	}
}

func TestFakeBootIDPersists(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fakehw") // made on first use
	id, err := fakeBootID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bootIDRE.MatchString(id) {
		t.Fatalf("fake boot id %q", id)
	}
	p := filepath.Join(dir, "boot_id")
	b, err := os.ReadFile(p)
	if err != nil || string(b) != id+"\n" {
		t.Fatalf("boot_id file %q %v, want %q", b, err, id+"\n")
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Errorf("boot_id mode %04o, want 0600", st.Mode().Perm())
	}
	if st, _ := os.Stat(dir); st.Mode().Perm() != 0o700 {
		t.Errorf("fakehw dir mode %04o, want 0700", st.Mode().Perm())
	}
	again, err := fakeBootID(dir)
	if err != nil || again != id {
		t.Fatalf("second call %q %v, want the same %q", again, err, id)
	}
	// Changing the file is a "reboot".
	const rebooted = "0f0e0d0c-0b0a-4908-8706-050403020100"
	if err := os.WriteFile(p, []byte("  "+rebooted+"\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := fakeBootID(dir); err != nil || got != rebooted {
		t.Errorf("after rewrite %q %v, want %q", got, err, rebooted)
	}
	// An empty file gets a new id.
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fresh, err := fakeBootID(dir)
	if err != nil || !bootIDRE.MatchString(fresh) || fresh == rebooted {
		t.Errorf("after emptying: %q %v", fresh, err)
	}
}

func TestFakeBootIDUnreadable(t *testing.T) {
	dir := t.TempDir()
	// boot_id is a directory: reading fails with something other than
	// "does not exist", which must be reported, not papered over.
	if err := os.Mkdir(filepath.Join(dir, "boot_id"), 0o700); err != nil {
		t.Fatal(err)
	}
	if id, err := fakeBootID(dir); err == nil {
		t.Fatalf("fakeBootID = %q, want an error", id)
	}
}

func TestBootID(t *testing.T) {
	dir := t.TempDir()
	id, err := BootID(dir)
	if buildinfo.FakeHW {
		if err != nil || !bootIDRE.MatchString(id) {
			t.Fatalf("fakehw BootID = %q %v", id, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "fakehw", "boot_id")); err != nil {
			t.Errorf("fakehw BootID kept nothing in the data dir: %v", err)
		}
		return
	}
	if _, serr := os.Stat("/proc/sys/kernel/random/boot_id"); serr != nil {
		if err == nil {
			t.Fatalf("BootID = %q without /proc", id)
		}
		testenv.Skip(t, "no /proc/sys/kernel/random/boot_id here (a Linux /proc)")
	}
	if err != nil || !bootIDRE.MatchString(id) {
		t.Fatalf("BootID = %q %v", id, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "fakehw")); !os.IsNotExist(err) {
		t.Errorf("a real build wrote into the data dir: %v", err)
	}
}

func TestClaims(t *testing.T) {
	c := Claims(t.TempDir())
	if c.GetArch() != runtime.GOARCH || c.GetOs() != runtime.GOOS {
		t.Errorf("arch/os %s/%s, want %s/%s", c.GetArch(), c.GetOs(), runtime.GOARCH, runtime.GOOS)
	}
	if h, err := os.Hostname(); err == nil && c.GetHostname() != h {
		t.Errorf("hostname %q, want %q", c.GetHostname(), h)
	}
	if c.GetBootId() != "" && !bootIDRE.MatchString(c.GetBootId()) {
		t.Errorf("boot id %q", c.GetBootId())
	}
}
