package qemutests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/disk/wipe"
	"github.com/klauspost/compress/zstd"
	"github.com/u-root/mkuimage/cpio"
)

const mib = 1 << 20

// overlay returns the ramdisk image with a second zstd cpio appended that
// adds bin/vmwipe and points bin/uinit at it (the kernel unpacks
// concatenated archives in order, later entries replacing earlier ones).
func overlay(t *testing.T, image string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmwipe")
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./qemu-tests/vmwipe")
	build.Dir = repoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./qemu-tests/vmwipe: %v\n%s", err, out)
	}
	exe, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	img := appendCPIO(t, base, []cpio.Record{cpio.StaticFile("bin/vmwipe", string(exe), 0o755), cpio.Symlink("bin/uinit", "vmwipe")})
	p := filepath.Join(dir, "initrd")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// appendCPIO returns an initramfs with a zstd cpio of recs appended: the
// kernel unpacks concatenated archives in order, later entries replacing
// earlier ones.
func appendCPIO(t *testing.T, base []byte, recs []cpio.Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	buf.Write(base)
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	w := cpio.Newc.Writer(zw)
	if err := cpio.WriteRecords(w, recs); err != nil {
		t.Fatal(err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type vmRun struct {
	Name   string      `json:"name"`
	Report wipe.Report `json:"report"`
}

// TestWipeInVM runs every wipe mode inside the VM against a virtio disk
// holding a GPT and an NVMe disk full of data, then reads both disk files
// back: the real ioctls (BLKGETSIZE64, O_DIRECT read-back, BLKSECDISCARD,
// NVME_IOCTL_ADMIN_CMD Identify and Format NVM) on a real kernel.
func TestWipeInVM(t *testing.T) {
	qemu, dir := prerequisites(t)
	initrd := overlay(t, filepath.Join(dir, "initramfs.cpio.zst"))

	const size = 64 * mib
	vda, nvme := sparseDisk(t, "vda.img", size), sparseDisk(t, "nvme.img", size)
	f, err := os.OpenFile(vda, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{0x55, 0xaa}, 510)
	f.WriteAt([]byte("EFI PART"), 512)
	f.WriteAt([]byte("EFI PART"), size-512)
	f.WriteAt([]byte("user data"), 10*mib)
	f.Close()
	f, err = os.OpenFile(nvme, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 32 * mib, size - mib} {
		f.WriteAt(bytes.Repeat([]byte{0xa5}, mib), off)
	}
	f.Close()

	b := runVM(t, qemu, filepath.Join(dir, "vmlinuz"), initrd, "vmwipe: loaded",
		"-drive", "file="+vda+",if=virtio,format=raw",
		"-drive", "file="+nvme+",if=none,id=nvm0,format=raw",
		"-device", "nvme,serial=bcdwipe0,drive=nvm0",
		"-nic", "none",
	)
	runs := map[string]wipe.Report{}
	for _, l := range b.log {
		_, js, ok := strings.Cut(l.text, "WIPE-REPORT ")
		if !ok {
			continue
		}
		var r vmRun
		if err := json.Unmarshal([]byte(js), &r); err != nil {
			t.Fatalf("report line %q: %v", js, err)
		}
		runs[r.Name] = r.Report
		t.Logf("%s: ok %v, method %q, error %q\n  found %q\n  steps %q", r.Name, r.Report.OK, r.Report.Method, r.Report.Error, r.Report.Found, r.Report.Steps)
	}
	if len(runs) != 6 {
		b.dump(t)
		t.Fatalf("%d wipe reports, want 6", len(runs))
	}

	expect := func(name string, ok bool, fields ...string) {
		t.Helper()
		r := runs[name]
		if r.OK != ok {
			t.Errorf("%s: ok %v, want %v (%s)", name, r.OK, ok, r.Error)
		}
		all, _ := json.Marshal(r)
		for _, f := range fields {
			if !strings.Contains(string(all), f) {
				t.Errorf("%s: report lacks %q: %s", name, f, all)
			}
		}
	}
	expect("vda quick", true, `"kind":"block device"`, `"read_back":"O_DIRECT"`,
		"MBR/boot sector signature at 510 (disk)", "GPT header at 512 (disk)", "GPT backup header at 67108352 (disk)")
	expect("vda secure-erase", false, "ioctl(/dev/vda, BLKSECDISCARD, [0, 67108864]) = operation not supported", "takes neither ATA nor SCSI commands")
	expect("vda crypto-erase", false, "not an NVMe namespace")
	expect("nvme crypto-erase", false, "QEMU NVMe Ctrl", "advertises no cryptographic erase")
	expect("nvme secure-erase", true, `"kind":"NVMe namespace 1"`, "NVMe Format NVM, Secure Erase Settings 1", "cdw10=0x200", "all gone, zeros")
	expect("nvme crypto-erase with the test override", true, "capabilities replaced for a test", "Secure Erase Settings 2", "cdw10=0x400", "all gone, zeros")

	// The disks, read back by the host.
	got, _ := os.ReadFile(vda)
	if !allZero(got[:mib]) || !allZero(got[size-mib:]) {
		t.Error("vda.img: the first or last MiB is not zero")
	}
	if string(got[10*mib:10*mib+9]) != "user data" {
		t.Error("vda.img: quick changed data outside its spans")
	}
	got, _ = os.ReadFile(nvme)
	if !allZero(got) {
		t.Error("nvme.img: data survived the NVMe format")
	}
	t.Logf("QEMU start -> wipe guest running %.1fs -> power off %.1fs", b.seen["u-root"].Seconds(), b.seen["poweroff"].Seconds())
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
