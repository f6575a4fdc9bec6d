package ramdiskkinds

import (
	"bytes"
	"context"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/disk/wipe/loopdev"
	"github.com/better-compute/bcd/images/osimage"
)

// Root tier: the test installed OS (images/osimage, with stand-in kernel
// bytes) deployed onto a real loop device with partition scanning:
// deploy.image writes it, re-reads the partition table, mounts the ext4
// partition and writes the OS's files; boot.kexec then reads the kernel
// from the same partition mounted read-only. debugfs reads the files back
// from the disk file itself.
func TestRootDeployConfiguresAndKexecReadsAPartition(t *testing.T) {
	testenv.NeedRoot(t, "loop devices and mounts")
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("ROOT TEST CANNOT RUN: %s is not installed (apt-get install e2fsprogs)", tool)
		}
	}
	if err := exec.Command("modprobe", "ext4").Run(); err != nil {
		t.Logf("modprobe ext4: %v (it may be built in)", err)
	}
	dir := t.TempDir()
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd")
	os.WriteFile(kernel, []byte("stand-in kernel"), 0o644)
	os.WriteFile(initrd, []byte("stand-in initramfs"), 0o644)
	img := filepath.Join(dir, "os.img.zst")
	res, err := osimage.Build(context.Background(), osimage.Config{Kernel: kernel, Initramfs: initrd, Output: img, Size: 16 * osimage.MiB})
	if err != nil {
		t.Fatal(err)
	}
	z, _ := os.ReadFile(img)
	url, digest := imageServer(t, z)
	if digest != res.SHA256 {
		t.Fatal("digest mismatch")
	}

	file := filepath.Join(dir, "disk.img")
	os.WriteFile(file, nil, 0o600)
	os.Truncate(file, 32*osimage.MiB)
	d, err := loopdev.Attach(file, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Detach()

	var loaded string
	c := Config{CacheURL: url, mount: hostMount(t),
		OS: OSFiles{ConfigTOML: []byte("gateway = \"https://gw\"\n"), JWK: []byte("{}\n")},
		secret: func(_ context.Context, name string) ([]byte, error) {
			return []byte("bcjt_provisioned_token"), nil
		},
		kexecLoader: func(k, i []byte, cmdline string) error {
			loaded = string(k) + "|" + string(i) + "|" + cmdline
			return nil
		}}
	ks := Kinds(c)
	out, err := kind(t, ks, "deploy.image").Run(context.Background(),
		[]byte(`{"target":"`+d.Path+`","sha256":"`+digest+`","os":{"partition":1,"node_id":"web-07"}}`))
	if err != nil {
		t.Fatalf("deploy.image: %v\n%s", err, out)
	}
	if _, err := kind(t, ks, "boot.kexec").Run(context.Background(),
		[]byte(`{"disk":"`+d.Path+`","partition":1,"kernel":"boot/vmlinuz","initrd":"boot/initramfs.cpio.zst","cmdline":"bcos.root=/dev/vda1"}`)); err != nil {
		t.Fatal(err)
	}
	if loaded != "stand-in kernel|stand-in initramfs|bcos.root=/dev/vda1" {
		t.Fatalf("kexec loaded %q", loaded)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), d.Path) {
		t.Fatalf("a partition of %s is still mounted", d.Path)
	}
	d.Detach()
	raw, _ := os.ReadFile(file)
	fs := filepath.Join(dir, "fs.img")
	os.WriteFile(fs, raw[osimage.PartitionStart:16*osimage.MiB], 0o600)
	for p, want := range map[string]string{
		"/etc/bcd/config.toml": "gateway = \"https://gw\"", "/etc/bcd/node-id": "web-07",
		"/etc/bcd/join-token": "bcjt_provisioned_token", "/etc/os-release": "bcd test OS",
	} {
		b, err := exec.Command("debugfs", "-R", "cat "+p, fs).Output()
		if err != nil || !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s on the disk: %q %v", p, b, err)
		}
	}
	if b, _ := exec.Command("debugfs", "-R", "stat /etc/bcd/join-token", fs).Output(); !strings.Contains(string(b), "Mode:  0600") {
		t.Errorf("join-token's mode:\n%s", b)
	}
}

// hostMount is mountPartition where this host's kernel reads partition
// tables; where it does not (some VM kernels are built without
// CONFIG_MSDOS_PARTITION, and /dev/loopNp1 never appears), the partition
// is reached through a second loop device at its offset, and the rest (the
// ext4 mount, the writes, the read-only kexec read) is the real path.
func hostMount(t *testing.T) func(string, int, bool) (string, func() error, error) {
	return func(disk string, part int, ro bool) (string, func() error, error) {
		if !kernelLacksMBR() {
			return mountPartition(disk, part, ro)
		}
		t.Logf("this host's kernel reads no MBR partition tables: partition %d through a loop device at its offset", part)
		out, err := exec.Command("losetup", "-f", "--show", "-o", "1048576", disk).Output()
		if err != nil {
			return "", nil, err
		}
		loop := strings.TrimSpace(string(out))
		dir, unmount, err := mountDevice(loop, ro)
		if err != nil {
			exec.Command("losetup", "-d", loop).Run()
			return "", nil, err
		}
		return dir, func() error {
			err := unmount()
			exec.Command("losetup", "-d", loop).Run()
			return err
		}, nil
	}
}

// kernelLacksMBR reports whether the running kernel's configuration says
// it was built without the MBR partition parser.
func kernelLacksMBR() bool {
	out, err := exec.Command("sh", "-c", "zcat /proc/config.gz | grep -c '^# CONFIG_MSDOS_PARTITION is not set'").Output()
	return err == nil && strings.TrimSpace(string(out)) == "1"
}
