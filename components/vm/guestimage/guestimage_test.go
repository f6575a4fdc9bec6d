package guestimage

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/vm/qcow2"
)

// TestLayout: the cached image is a qcow2 base (no backing file, as the
// instances' image check wants) whose disk has syslinux's MBR code, an
// active FAT partition 1 holding syslinux, the kernel, the initrd and
// the configuration that boots the root on partition 2, an ext4 labelled
// bcdroot. That it boots and runs cloud-init is
// e2e/TestInstancesOnLibvirtThroughHelper's proof.
func TestLayout(t *testing.T) {
	img := Cached(t)
	if _, err := qcow2.CheckFile(img.Path, qcow2.Backing{}); err != nil {
		t.Fatalf("the image is not a base image the instances accept: %v", err)
	}
	sum, err := fileSHA256(img.Path)
	if err != nil || sum != img.SHA256 {
		t.Fatalf("SHA-256 %s (%v), the cache says %s", sum, err, img.SHA256)
	}
	qemuImg := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	raw := filepath.Join(t.TempDir(), "disk.raw")
	if out, err := exec.Command(qemuImg, "convert", "-f", "qcow2", "-O", "raw", img.Path, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, out)
	}
	out, err := exec.Command("sfdisk", "--dump", raw).Output()
	if err != nil {
		t.Fatalf("sfdisk --dump: %v", err)
	}
	dump := string(out)
	if !strings.Contains(dump, "label: dos") || !strings.Contains(dump, "start=        2048, size=      131072, type=c, bootable") ||
		!strings.Contains(dump, "start=      133120,") || !strings.Contains(dump, "type=83") {
		t.Errorf("partition table:\n%s", dump)
	}
	code, _ := os.ReadFile("/usr/lib/syslinux/mbr/mbr.bin")
	head := make([]byte, len(code))
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	f.ReadAt(head, 0)
	f.Close()
	if len(code) == 0 || !bytes.Equal(head, code) {
		t.Error("the MBR does not hold syslinux's boot code")
	}
	out, err = exec.Command("mdir", "-a", "-b", "-i", raw+"@@1048576", "::/").CombinedOutput()
	if err != nil {
		t.Fatalf("mdir: %v\n%s", err, out)
	}
	for _, want := range []string{"::/ldlinux.sys", "::/ldlinux.c32", "::/vmlinuz", "::/initrd.img", "::/syslinux.cfg"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the boot partition lacks %s:\n%s", want, out)
		}
	}
	cfg, err := exec.Command("mtype", "-i", raw+"@@1048576", "::/syslinux.cfg").Output()
	if err != nil || !strings.Contains(string(cfg), "APPEND "+KernelArgs) {
		t.Errorf("syslinux.cfg (%v):\n%s", err, cfg)
	}
	blkid, err := exec.Command("blkid", "-p", "-O", "68157440", "-s", "LABEL", "-o", "value", raw).Output()
	if err != nil || strings.TrimSpace(string(blkid)) != "bcdroot" {
		t.Errorf("partition 2's label: %q (%v)", blkid, err)
	}
}
