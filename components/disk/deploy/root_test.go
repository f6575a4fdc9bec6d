package deploy

import (
	"bytes"
	"context"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/disk/wipe/loopdev"
)

func needRoot(t testing.TB) {
	t.Helper()
	testenv.NeedRoot(t, "loop devices")
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testenv.Skip(t, "no loop devices: %v", err)
	}
}

// loopDisk attaches a sparse file of size bytes, pre-filled with 0xaa so
// what was not written is visible, and returns the device and the file.
func loopDisk(t testing.TB, size int) (dev, file string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, bytes.Repeat([]byte{0xaa}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := loopdev.Attach(file, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Detach() })
	return d.Path, file
}

func TestRootWriteLoop(t *testing.T) {
	needRoot(t)
	img := osImage(8 * MiB)
	for _, c := range []Compression{Zstd, Gzip} {
		t.Run(string(c), func(t *testing.T) {
			dev, file := loopDisk(t, 16*MiB)
			src := compress(t, img, c)
			res, err := Write(context.Background(), bytes.NewReader(src), sum(src), Auto, dev, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Compression != c || res.Written != int64(len(img)) {
				t.Errorf("result %+v", res)
			}
			got, _ := os.ReadFile(file)
			if !bytes.Equal(got[:len(img)], img) {
				t.Error("the disk does not hold the image")
			}
			if !bytes.Equal(got[len(img):], bytes.Repeat([]byte{0xaa}, len(got)-len(img))) {
				t.Error("bytes after the image changed")
			}
			t.Logf("notes: %q", res.Notes)
		})
	}
}

func TestRootWrongDigestLoop(t *testing.T) {
	needRoot(t)
	img := osImage(8 * MiB)
	src := compress(t, img, Zstd)
	dev, file := loopDisk(t, 16*MiB)
	_, err := Write(context.Background(), bytes.NewReader(src), sum([]byte("other")), Auto, dev, nil)
	if err == nil || !strings.Contains(err.Error(), "zeroed the first MiB and the last MiB written of "+dev+" and read them back (O_DIRECT)") {
		t.Fatalf("Write = %v", err)
	}
	got, _ := os.ReadFile(file)
	if !isZero(got[:MiB]) || !isZero(got[len(img)-MiB:len(img)]) {
		t.Error("the first MiB or the last MiB written is not zero")
	}
	if !bytes.Equal(got[MiB:len(img)-MiB], img[MiB:len(img)-MiB]) {
		t.Error("the rest of the image is not on the disk")
	}
}

func TestRootLargerThanTarget(t *testing.T) {
	needRoot(t)
	img := osImage(8 * MiB)
	src := compress(t, img, Zstd)
	dev, file := loopDisk(t, 4*MiB)
	_, err := Write(context.Background(), bytes.NewReader(src), sum(src), Auto, dev, nil)
	if err == nil || !strings.Contains(err.Error(), "no space left on device: the image is larger than the target") || !strings.Contains(err.Error(), "left unbootable") {
		t.Fatalf("Write = %v", err)
	}
	got, _ := os.ReadFile(file)
	if !isZero(got[:MiB]) {
		t.Error("the first MiB is not zero")
	}
}
