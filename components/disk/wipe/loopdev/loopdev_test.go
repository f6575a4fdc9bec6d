package loopdev

import (
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAttach(t *testing.T) {
	testenv.NeedRoot(t, "loop devices")
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 8<<20); err != nil {
		t.Fatal(err)
	}
	d, err := Attach(p, false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(d.Path)
	if err != nil {
		t.Fatal(err)
	}
	size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	f.Close()
	if err != nil || size != 8<<20 {
		t.Errorf("BLKGETSIZE64 of %s = %d, %v", d.Path, size, err)
	}
	if err := d.Detach(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/sys/block/" + filepath.Base(d.Path) + "/loop/backing_file"); err == nil {
		t.Errorf("%s still attached to %s", d.Path, b)
	}
}
