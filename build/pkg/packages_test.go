package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeRamdisk writes placeholder artifacts and their digests into dir.
func writeRamdisk(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range ramdiskFiles {
		data := []byte("placeholder " + f + "\n")
		if f == "vmlinuz" {
			data = bzImage()
		}
		sum := sha256.Sum256(data)
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f+".sha256"), []byte(hex.EncodeToString(sum[:])+"  "+f+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// bzImage is a stand-in x86 kernel: zeros with the boot protocol's
// signature.
func bzImage() []byte {
	b := make([]byte, 1024)
	copy(b[0x202:], "HdrS")
	return b
}

func TestRamdiskSpec(t *testing.T) {
	images := t.TempDir()
	o := &options{images: images, license: "X"}

	if _, ok, why, err := ramdiskSpec(o, "amd64"); ok || err != nil || !strings.Contains(why, "vmlinuz is missing") {
		t.Fatalf("no artifacts: ok %v, why %q, err %v; want a reason to skip", ok, why, err)
	}

	// The amd64 ramdisk sits in images/out itself; arm64's in arm64/.
	writeRamdisk(t, images)
	s, ok, _, err := ramdiskSpec(o, "amd64")
	if !ok || err != nil {
		t.Fatalf("amd64: ok %v, err %v", ok, err)
	}
	if s.Name != "bcd-ramdisk-image-amd64" || s.Arch != "all" || len(s.Files) != 6 {
		t.Errorf("amd64: name %s, arch %s, %d files", s.Name, s.Arch, len(s.Files))
	}
	for _, f := range s.Files {
		if !strings.HasPrefix(f.Dst, "/usr/share/bcd/ramdisk/amd64/") {
			t.Errorf("amd64: %s is outside /usr/share/bcd/ramdisk/amd64/", f.Dst)
		}
	}
	if _, ok, _, _ := ramdiskSpec(o, "arm64"); ok {
		t.Error("arm64: took the amd64 artifacts")
	}
	writeRamdisk(t, filepath.Join(images, "arm64"))
	if s, ok, _, err := ramdiskSpec(o, "arm64"); !ok || err != nil || s.Files[0].Src != filepath.Join(images, "arm64", "vmlinuz") {
		t.Errorf("arm64: ok %v, err %v", ok, err)
	}

	// A flat images/out that holds no x86 kernel is not the amd64 ramdisk.
	other := t.TempDir()
	writeRamdisk(t, other)
	data := []byte("an arm64 Image\n")
	sum := sha256.Sum256(data)
	os.WriteFile(filepath.Join(other, "vmlinuz"), data, 0o644)
	os.WriteFile(filepath.Join(other, "vmlinuz.sha256"), []byte(hex.EncodeToString(sum[:])+"  vmlinuz\n"), 0o644)
	if _, _, _, err := ramdiskSpec(&options{images: other}, "amd64"); err == nil || !strings.Contains(err.Error(), "not an x86 bzImage") {
		t.Errorf("a non-x86 kernel as amd64: err %v", err)
	}

	// A digest that does not match is an error, not a skip.
	if err := os.WriteFile(filepath.Join(images, "initramfs.cpio.zst"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := ramdiskSpec(o, "amd64"); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Errorf("changed initramfs: err %v, want a SHA-256 mismatch", err)
	}
}

func TestWrap(t *testing.T) {
	got := wrap("aaa bbb ccc\n\nddd", 7)
	if want := "aaa bbb\nccc\n\nddd"; got != want {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}
