package qemutests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/vm/guestimage"
)

// The systemd tier's guest: a Debian root made by debootstrap from
// Debian's packages, with Debian's kernel and systemd as PID 1, turned
// into an ext4 image with mkfs.ext4 -d (no loop mount). It is made once
// and cached under os.UserCacheDir()/bcd-systemd-guest/KEY, KEY being the
// digest of the suite, the package list and the setup below: a second run
// does not debootstrap again, and a change to any of them makes a new one.
const guestSuite = "bookworm"

// guestPackages are what debootstrap --variant=minbase adds: systemd as
// init, udev, D-Bus (systemd-analyze and systemctl talk to the manager
// over it), Debian's kernel (its initramfs-tools initrd finds the virtio
// disk), iproute2 and procps for the tests, and Debian's sshd
// (openssh-server: the ssh.service the helper's ssh.reload reloads), and
// GRUB's configuration tools (grub2-common: update-grub and grub-mkconfig,
// which the host units' kernel command line goes through; the harness
// boots the kernel with the line they render, guest_test.go), and
// PostgreSQL and HAProxy for the quick start (docs/quickstart.md: the
// guest has no Internet, so the page's apt-get install of them finds
// them installed; the image has them disabled, see guestSetup).
var guestPackages = []string{
	"systemd", "systemd-sysv", "udev", "dbus", "linux-image-amd64",
	"iproute2", "kmod", "procps", "zstd", "openssh-server", "grub2-common",
	"postgresql", "haproxy",
}

// The guest's static network: the host side of the namespace is
// guestHostIP on br0, the guest guestIP on its first NIC (eth0).
const (
	guestHostIP = "10.78.0.1"
	guestIP     = "10.78.0.2"
)

// guestFiles are written into the root before it becomes an image.
var guestFiles = map[string]string{
	"etc/hostname": "bcd-guest\n",
	"etc/hosts":    "127.0.0.1 localhost\n127.0.1.1 bcd-guest\n",
	"etc/fstab": "/dev/vda / ext4 rw,errors=remount-ro 0 1\n" +
		// The test's data disk: the agent, built by each run.
		"LABEL=BCDTEST /media/bcdtest ext4 ro,nofail,x-systemd.device-timeout=10min 0 0\n",
	"etc/systemd/network/10-test.network": "[Match]\nName=eth0\n\n[Network]\nAddress=" + guestIP + "/24\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n",
	// The test's agent (qemu-tests/guestagent) on a virtio-serial port,
	// up as early as its disk is mounted so a boot that hangs later can
	// still be looked at.
	"etc/systemd/system/bcd-test-agent.service": `[Unit]
Description=bcd systemd tier: the test's agent on /dev/virtio-ports/bcd.agent
DefaultDependencies=no
RequiresMountsFor=/media/bcdtest
After=systemd-udevd.service
Conflicts=shutdown.target
Before=shutdown.target

[Service]
ExecStart=/media/bcdtest/guestagent
Restart=always
RestartSec=1

[Install]
WantedBy=sysinit.target
`,
	// Nothing in the guest reaches out: no apt timers.
	"etc/apt/apt.conf.d/99-bcd-test": "APT::Periodic::Enable \"0\";\n",
	// A small initrd: only the modules that find the root disk (Debian's
	// default, MODULES=most, is 36 MB and slow to unpack under TCG).
	"etc/initramfs-tools/conf.d/bcd-test": "MODULES=list\nCOMPRESS=zstd\n",
	"etc/initramfs-tools/modules":         "virtio_pci\nvirtio_blk\next4\n",
}

// guestSetup runs in the root (chroot) after the files are written.
var guestSetup = []string{
	"systemctl enable systemd-networkd.service bcd-test-agent.service",
	// Installed for the quick start only: they do not start at every
	// boot of the other steps (the quick start starts them, as apt-get
	// install does on a host that did not have them).
	"systemctl disable postgresql.service haproxy.service",
	"systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer getty@tty1.service dpkg-db-backup.timer",
	"passwd -d root",
	"mkdir -p /boot/grub",
	"update-initramfs -u -k all",
	// apt's package cache, which the first apt install would otherwise
	// build in the guest (about 50 s of the step under TCG).
	"apt-cache gencaches",
	"rm -f /etc/machine-id /var/lib/dbus/machine-id && touch /etc/machine-id",
}

// guestImage is a built guest: its root disk (raw ext4), kernel (and the
// same kernel uncompressed, when it could be extracted) and initrd, and
// the stand-in nvidia modules built for that kernel (systemd_nvidia_test.go).
type guestImage struct{ disk, kernel, vmlinux, initrd, standin string }

// bootKernel is what QEMU's -kernel gets: the vmlinux when there is one.
func (i guestImage) bootKernel() string {
	if _, err := os.Stat(i.vmlinux); err == nil {
		return i.vmlinux
	}
	return i.kernel
}

// The cache has two levels: the debootstrap root, keyed by the suite and
// the package list alone (debootstrap is the slow part, minutes), and the
// image made from a copy of it, keyed by everything that goes into it.
func rootCacheKey() string {
	h := sha256.Sum256([]byte(fmt.Sprintf("suite %s\npackages %s\n", guestSuite, strings.Join(guestPackages, ","))))
	return "root-" + guestSuite + "-" + hex.EncodeToString(h[:])[:16]
}

func imageCacheKey() string {
	return guestimage.ImageKey(fmt.Sprintf("root %s\nkernel vmlinux for PVH\nstandin %s %s\n", rootCacheKey(), strings.Join(standinVersions, ","), standinSource), guestFiles, guestSetup)
}

func guestCacheBase() string {
	if d := os.Getenv("BCD_GUEST_CACHE"); d != "" {
		return d
	}
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "bcd-systemd-guest")
}

// cachedGuest returns the cached guest image, building what is missing
// (another process building at the same time is waited for on a lock).
// Without root, debootstrap or the mirror it skips, which fails under CI.
func cachedGuest(t *testing.T) guestImage {
	t.Helper()
	cache := guestCacheBase()
	base := filepath.Join(cache, imageCacheKey())
	img := guestImage{disk: filepath.Join(base, "root.img"), kernel: filepath.Join(base, "vmlinuz"), vmlinux: filepath.Join(base, "vmlinux"), initrd: filepath.Join(base, "initrd.img"), standin: filepath.Join(base, "nvidia-standin")}
	if _, err := os.Stat(filepath.Join(base, "ok")); err == nil {
		t.Logf("guest: image cached in %s", base)
		guestimage.TouchCache(base)
		if _, err := os.Stat(img.vmlinux); err != nil {
			// An image cached before its vmlinux could be extracted.
			tmp := fmt.Sprintf("%s.%d", img.vmlinux, os.Getpid())
			if err := extractVmlinux(img.kernel, tmp); err == nil {
				os.Rename(tmp, img.vmlinux)
			}
			os.Remove(tmp)
		}
		return img
	}
	if os.Geteuid() != 0 {
		need(t, "root (debootstrap, chroot)", errNotRoot)
	}
	for _, tool := range [][2]string{{"debootstrap", "debootstrap"}, {"mkfs.ext4", "e2fsprogs"}, {"chroot", "coreutils"}} {
		if _, err := exec.LookPath(tool[0]); err != nil {
			need(t, tool[0]+" (apt-get install "+tool[1]+")", err)
		}
	}
	defer guestimage.LockCache(t, cache)()
	if _, err := os.Stat(filepath.Join(base, "ok")); err == nil {
		return img
	}
	cachedRoot := debootstrapRoot(t, cache)
	start := time.Now()
	tmp := base + ".tmp"
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "root")
	guestimage.PrepareRoot(t, cachedRoot, root, guestFiles, guestSetup)
	if err := buildStandinModules(root, filepath.Join(tmp, filepath.Base(img.standin))); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ glob, dst string }{{"vmlinuz-*", img.kernel}, {"initrd.img-*", img.initrd}} {
		m, _ := filepath.Glob(filepath.Join(root, "boot", f.glob))
		if len(m) != 1 {
			t.Fatalf("the guest root has %d boot/%s, want 1", len(m), f.glob)
		}
		if out, err := exec.Command("cp", m[0], filepath.Join(tmp, filepath.Base(f.dst))).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", m[0], err, out)
		}
	}
	// The kernel uncompressed (vmlinux), booted by its PVH entry: it
	// skips the bzImage's xz decompression, which under TCG costs seconds
	// (tens of seconds on a loaded machine). Without xz, the bzImage.
	if err := extractVmlinux(filepath.Join(tmp, "vmlinuz"), filepath.Join(tmp, "vmlinux")); err != nil {
		t.Logf("guest: no vmlinux (booting the bzImage): %v", err)
	}
	// The image: the root's size plus room for the tests, sparse.
	du, err := exec.Command("du", "-sm", root).Output()
	if err != nil {
		t.Fatalf("du -sm %s: %v", root, err)
	}
	var mb int
	fmt.Sscan(string(du), &mb)
	size := fmt.Sprintf("%dM", mb+1024)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "bcdroot", "-d", root, filepath.Join(tmp, "root.img"), size).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 -d %s: %v\n%s", root, err, out)
	}
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(base)
	if err := os.Rename(tmp, base); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest: image made in %s (%s, ext4 by mkfs.ext4 -d), cached in %s", time.Since(start).Round(time.Second), size, base)
	guestimage.PruneCache(cache, filepath.Base(base), filepath.Base(filepath.Dir(cachedRoot)))
	return img
}

// debootstrapRoot returns the cached debootstrap root for guestPackages,
// making it when missing (the caller holds the cache's lock).
func debootstrapRoot(t *testing.T, cache string) string {
	t.Helper()
	return guestimage.DebootstrapRoot(t, filepath.Join(cache, rootCacheKey()), guestPackages, []string{"apt-get", "clean"})
}

// extractVmlinux writes the ELF kernel inside a bzImage whose payload is
// xz-compressed (Debian's), or fails.
func extractVmlinux(bzImage, out string) error {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	i := bytes.Index(b, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return fmt.Errorf("%s: no xz payload", bzImage)
	}
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(b[i:])
	elf, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("xz -dc of %s's payload: %w", bzImage, err)
	}
	if !bytes.HasPrefix(elf, []byte("\x7fELF")) {
		return fmt.Errorf("%s's payload is not an ELF kernel", bzImage)
	}
	return os.WriteFile(out, elf, 0o644)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
