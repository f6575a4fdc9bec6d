package wipe

import (
	"context"
	"crypto/sha256"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/disk/wipe/loopdev"
	"golang.org/x/sys/unix"
)

// needRoot skips loudly without root (CI runs as root) and fails under
// CI=true when loop devices are missing.
func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "loop devices")
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testenv.Skip(t, "no loop devices: %v", err)
	}
}

// sparseDisk makes a sparse file with a GPT, one partition holding an ext4
// and an md RAID 1.0 signature, and user data in the middle.
func sparseDisk(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(testSize); err != nil {
		t.Fatal(err)
	}
	plantGPT(t, f, testSize, 2048, testSize/512-4096-1)
	plantFS(t, f, testPart)
	if _, err := f.WriteAt([]byte("user data"), 10*MiB); err != nil {
		t.Fatal(err)
	}
	return p
}

func attach(t *testing.T, file string, partscan bool) string {
	t.Helper()
	d, err := loopdev.Attach(file, partscan)
	if err != nil {
		t.Fatalf("attaching %s: %v", file, err)
	}
	t.Cleanup(func() {
		if err := d.Detach(); err != nil {
			t.Error(err)
		}
	})
	return d.Path
}

// TestRootQuickLoop wipes a loop device whose GPT the kernel scanned, then
// reads the backing file: both ends of the disk and of the partition are
// zero and no signature is left.
func TestRootQuickLoop(t *testing.T) {
	needRoot(t)
	file := sparseDisk(t)
	dev := attach(t, file, true)

	// Wait for the kernel's partition scan to show in sysfs.
	d, err := Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	var parts []Span
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if parts, err = d.Partitions(); err != nil || len(parts) > 0 {
			break
		}
	}
	d.Close()
	if err != nil {
		t.Fatal(err)
	}
	kernelParts := len(parts) > 0
	if !kernelParts {
		// Some kernels (this lab's host: no CONFIG_EFI_PARTITION) never
		// see the GPT. Describe the partition in a stand-in sysfs tree so
		// the real sysfs reading and the partition spans still run.
		t.Logf("the kernel lists no partitions on %s (no GPT support?): using a stand-in sysfs", dev)
		standInSysfs(t, dev, testPart)
	} else if !slices.Equal(parts, []Span{testPart}) {
		t.Fatalf("the kernel sees partitions %v on %s, want %v", parts, dev, []Span{testPart})
	}

	r, err := Wipe(context.Background(), dev, Options{Mode: Quick})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report: %+v", r)
	if r.Kind != "block device" || r.Size != testSize || r.ReadBack != "O_DIRECT" {
		t.Errorf("kind %q size %d read back %q", r.Kind, r.Size, r.ReadBack)
	}
	if !slices.Equal(r.Found, wantFound) {
		t.Errorf("found\n %q\nwant\n %q", r.Found, wantFound)
	}
	if want := quickSpans(testSize, []Span{testPart}); !slices.Equal(r.Verified, want) {
		t.Errorf("verified %v, want %v", r.Verified, want)
	}

	// The backing file, read independently, says the same.
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Verified {
		if i := nonZero(b[s.Off:s.End()]); i >= 0 {
			t.Errorf("backing file byte %d is %#x", s.Off+int64(i), b[s.Off+int64(i)])
		}
	}
	if string(b[10*MiB:10*MiB+9]) != "user data" {
		t.Error("quick wiped outside its spans")
	}
	if got := detect(&window{parts: []struct {
		off int64
		b   []byte
	}{{0, b}}}, testSize, []Span{testPart}); len(got) != 0 {
		t.Errorf("signatures left: %v", got)
	}
	// util-linux's probe, when installed, agrees.
	if _, err := exec.LookPath("wipefs"); err == nil {
		out, err := exec.Command("wipefs", "--no-act", "--noheadings", file).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("wipefs --no-act %s: %v: %s", file, err, out)
		}
	}
	if kernelParts {
		// The kernel dropped the partition after BLKRRPART.
		d, err = Open(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if parts, _ := d.Partitions(); len(parts) != 0 {
			t.Errorf("the kernel still lists partitions %v after the wipe", parts)
		}
	}
}

// standInSysfs points SysBlock at a tree listing part as dev's partition.
func standInSysfs(t *testing.T, dev string, part Span) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	dir := filepath.Join(root, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), filepath.Base(dev)+"p1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int64{"partition": 1, "start": part.Off / 512, "size": part.Len / 512} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(fmt.Sprintf("%d\n", v)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := SysBlock
	SysBlock = root
	t.Cleanup(func() { SysBlock = old })
}

// TestRootEraseLoopFails: a loop device can do neither secure-erase
// (BLKSECDISCARD is EOPNOTSUPP, ATA erase is not implemented) nor
// crypto-erase (no NVMe), and says so without changing a byte.
func TestRootEraseLoopFails(t *testing.T) {
	needRoot(t)
	file := sparseDisk(t)
	dev := attach(t, file, false)
	b, _ := os.ReadFile(file)
	sum := sha256.Sum256(b)
	for mode, want := range map[Mode]string{
		SecureErase: "takes neither ATA nor SCSI commands, and ioctl(/dev/loop0, BLKSECDISCARD, [0, 67108864]) = operation not supported",
		CryptoErase: "is a block device that takes no SCSI commands, not an NVMe namespace",
	} {
		r, err := Wipe(context.Background(), dev, Options{Mode: mode})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", mode, err, want)
		}
		if r.OK {
			t.Errorf("%s: report OK", mode)
		}
		t.Logf("%s: %s; steps %q", mode, r.Error, r.Steps)
	}
	b, _ = os.ReadFile(file)
	if sha256.Sum256(b) != sum {
		t.Error("a failed erase changed the disk")
	}
}

// TestRootExclusive: a device held exclusively (here: by another wipe's
// open) is refused, as a mounted disk would be.
func TestRootExclusive(t *testing.T) {
	needRoot(t)
	dev := attach(t, sparseDisk(t), false)
	d, err := Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = Wipe(context.Background(), dev, Options{Mode: Quick})
	if err == nil || !strings.Contains(err.Error(), "device or resource busy") {
		t.Errorf("second exclusive open: %v", err)
	}
}
