package osimage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestBuild(t *testing.T) {
	testenv.NeedTool(t, "debugfs", "e2fsprogs")
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "k"), filepath.Join(dir, "i")
	os.WriteFile(kernel, []byte("a kernel image"), 0o644)
	os.WriteFile(initrd, bytes.Repeat([]byte("initramfs "), 1000), 0o644)
	out := filepath.Join(dir, "os.img.zst")
	res, err := Build(context.Background(), Config{Kernel: kernel, Initramfs: initrd, Output: out, Size: 16 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	z, _ := os.ReadFile(out)
	sum := sha256.Sum256(z)
	if res.SHA256 != hex.EncodeToString(sum[:]) || res.Size != int64(len(z)) {
		t.Fatalf("result %+v for %d bytes", res, len(z))
	}
	if line, _ := os.ReadFile(out + ".sha256"); string(line) != res.SHA256+"  os.img.zst\n" {
		t.Errorf(".sha256 = %q", line)
	}
	dec, _ := zstd.NewReader(nil)
	raw, err := dec.DecodeAll(z, nil)
	if err != nil || len(raw) != 16*MiB {
		t.Fatalf("decompressed %d bytes: %v", len(raw), err)
	}
	if raw[510] != 0x55 || raw[511] != 0xaa || raw[446+4] != 0x83 ||
		binary.LittleEndian.Uint32(raw[446+8:]) != 2048 || binary.LittleEndian.Uint32(raw[446+12:]) != (16*MiB-MiB)/512 {
		t.Fatalf("MBR % x", raw[446:512])
	}
	fs := filepath.Join(dir, "fs.img")
	os.WriteFile(fs, raw[PartitionStart:], 0o600)
	for p, want := range map[string]string{"/" + KernelPath: "a kernel image", "/etc/os-release": "bcd test OS"} {
		b, err := exec.Command("debugfs", "-R", "cat "+p, fs).Output()
		if err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s in the file system: %q %v", p, b, err)
		}
	}
	if b, _ := exec.Command("debugfs", "-R", "stat /etc/bcd", fs).Output(); !strings.Contains(string(b), "Type: directory") {
		t.Errorf("/etc/bcd: %s", b)
	}
}
