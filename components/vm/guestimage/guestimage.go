// Package guestimage builds, once, a Debian guest for tests of bcd's
// instances: a qcow2 disk that boots on its own with libvirt's default
// firmware (SeaBIOS) and runs real cloud-init from the instance's NoCloud
// seed. The root is made by debootstrap (bookworm) with Debian's kernel,
// systemd, cloud-init, sshd and curl; the disk is written with no loop
// device or mount: an MBR (sfdisk) with syslinux's boot code, partition 1
// a FAT holding syslinux, the kernel and a small initrd (mkfs.fat,
// syslinux and mcopy at the partition's offset), partition 2 the root
// (mkfs.ext4 -d at its offset), then qemu-img convert to qcow2.
//
// The result is cached under os.UserCacheDir()/bcd-vm-guest (or
// $BCD_VM_GUEST_CACHE) by the digest of everything that goes into it, the
// debootstrap root by the suite and package list alone, behind a lock so
// concurrent tests build it once. It needs root (debootstrap, chroot) and
// the Debian mirror the first time. It is linked only by tests;
// docs/instances.md says what it proves.
package guestimage

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// Suite is the Debian release the guest runs.
const Suite = "bookworm"

// base is what debootstrap --variant=minbase adds: systemd as init with
// udev and D-Bus, zstd for the initrd.
var base = []string{"systemd", "systemd-sysv", "udev", "dbus", "kmod", "zstd"}

// packages are then installed by apt in the root (debootstrap does not
// resolve virtual packages, which cloud-init's Python dependencies
// need): Debian's kernel (initramfs-tools), cloud-init, sshd, curl and
// iproute2 for what the tests run in the guest.
var packages = []string{"linux-image-amd64", "cloud-init", "openssh-server", "curl", "iproute2"}

// KernelArgs is the guest kernel's command line: the root on the disk's
// second partition, the console on the first serial port, where the
// tests read it.
const KernelArgs = "root=/dev/vda2 ro console=ttyS0,115200 panic=-1 net.ifnames=0"

// files are written into the root before it becomes an image.
var files = map[string]string{
	"etc/fstab": "/dev/vda2 / ext4 rw,errors=remount-ro 0 1\n",
	// cloud-init reads only the NoCloud seed: it never probes the
	// network for another cloud's metadata service. It configures no
	// network (a test that wants one sets it up from its user data), and
	// makes only an ed25519 host key (RSA key generation takes seconds
	// under TCG).
	"etc/cloud/cloud.cfg.d/90-bcd-test.cfg": "datasource_list: [ NoCloud, None ]\n" +
		"network: {config: disabled}\n" +
		"ssh_genkeytypes: [ ed25519 ]\n",
	// Nothing in the guest reaches out: no apt timers.
	"etc/apt/apt.conf.d/99-bcd-test": "APT::Periodic::Enable \"0\";\n",
	// A small initrd: only the modules that find the root disk (Debian's
	// default, MODULES=most, is 36 MB and slow to unpack under TCG).
	"etc/initramfs-tools/conf.d/bcd-test": "MODULES=list\nCOMPRESS=zstd\n",
	"etc/initramfs-tools/modules":         "virtio_pci\nvirtio_blk\next4\n",
	// The identity rebind's guest side (docs/instances.md, "Identity
	// rebind"): what a tenant image needs to take its own SSH host key
	// after a memory restore.
	identityRulePath:   identityRule,
	identityUnitPath:   identityUnit,
	identityScriptPath: identityScript,
}

// setup runs in the root (chroot) after the files are written.
var setup = []string{
	// What a boot under TCG does not need: timers, a getty on the
	// graphics console the domain does not have, and waiting for a
	// network that is configured later if at all.
	"systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer " +
		"dpkg-db-backup.timer man-db.timer getty@tty1.service systemd-networkd-wait-online.service",
	"update-initramfs -u -k all",
	"chmod 0755 /" + identityScriptPath,
	// Made at first boot by cloud-init and systemd, per instance.
	"rm -f /etc/ssh/ssh_host_* /etc/machine-id /var/lib/dbus/machine-id && touch /etc/machine-id",
	"apt-get clean",
	"rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/*",
}

// syslinuxCfg boots the kernel from the FAT partition at once.
const syslinuxCfg = "DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  KERNEL /vmlinuz\n  INITRD /initrd.img\n  APPEND " + KernelArgs + "\n"

// Image is a built guest image.
type Image struct {
	// Path is the qcow2 image (no backing file); SHA256 its digest, lower
	// case hex.
	Path, SHA256 string
}

// The disk's layout, in 512-byte sectors: partition 1 (FAT, boot) from
// 1 MiB, partition 2 (ext4, root) after it.
const (
	sector    = 512
	bootStart = 2048
	bootMiB   = 64
	// rootSlackMiB is room on the root beyond what the packages take:
	// cloud-init's state, logs, what a test writes.
	rootSlackMiB = 512
)

func rootKey() string {
	h := sha256.Sum256([]byte(fmt.Sprintf("suite %s\nbase %s\npackages %s\n", Suite, strings.Join(base, ","), strings.Join(packages, ","))))
	return "root-" + Suite + "-" + hex.EncodeToString(h[:])[:16]
}

func imageKey() string {
	return ImageKey(fmt.Sprintf("root %s\nsyslinux.cfg %s\nboot %d MiB slack %d MiB\n", rootKey(), syslinuxCfg, bootMiB, rootSlackMiB), files, setup)
}

// ImageKey names a cached image: image-Suite- and the digest of header
// (what else goes into it: its root's key, its layout), its files and
// its setup commands.
func ImageKey(header string, files map[string]string, setup []string) string {
	h := sha256.New()
	io.WriteString(h, header)
	keys := make([]string, 0, len(files))
	for k := range files {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "file %s\n%s\n", k, files[k])
	}
	for _, c := range setup {
		fmt.Fprintf(h, "setup %s\n", c)
	}
	return "image-" + Suite + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

func cacheBase() string {
	if d := os.Getenv("BCD_VM_GUEST_CACHE"); d != "" {
		return d
	}
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "bcd-vm-guest")
}

// Cached returns the guest image, building what is missing (a test
// building it at the same time is waited for on the cache's lock). The
// first build takes minutes; without root, the tools or the mirror it
// skips through testenv (a failure under CI).
func Cached(t testing.TB) Image {
	t.Helper()
	cache := cacheBase()
	dir := filepath.Join(cache, imageKey())
	if img, ok := cached(dir); ok {
		return img
	}
	testenv.NeedRoot(t, "the guest image is made with debootstrap and chroot")
	tools := map[string]string{}
	for _, tool := range [][2]string{{"debootstrap", "debootstrap"}, {"chroot", "coreutils"}, {"mkfs.ext4", "e2fsprogs"},
		{"sfdisk", "fdisk"}, {"mkfs.fat", "dosfstools"}, {"syslinux", "syslinux"}, {"mcopy", "mtools"}, {"qemu-img", "qemu-utils"}} {
		tools[tool[0]] = testenv.NeedTool(t, tool[0], tool[1])
	}
	mbr := "/usr/lib/syslinux/mbr/mbr.bin"
	if _, err := os.Stat(mbr); err != nil {
		testenv.Skip(t, "%s is missing (apt-get install syslinux-common): %v", mbr, err)
	}
	defer LockCache(t, cache)()
	if img, ok := cached(dir); ok {
		return img
	}
	cachedRoot := debootstrapRoot(t, cache)
	start := time.Now()
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(tmp, "root")
	PrepareRoot(t, cachedRoot, root, files, setup)
	boot := filepath.Join(tmp, "boot")
	if err := os.MkdirAll(boot, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct{ glob, name string }{{"vmlinuz-*", "vmlinuz"}, {"initrd.img-*", "initrd.img"}} {
		m, _ := filepath.Glob(filepath.Join(root, "boot", f.glob))
		if len(m) != 1 {
			t.Fatalf("the guest root has %d boot/%s, want 1", len(m), f.glob)
		}
		run(t, "", "cp", m[0], filepath.Join(boot, f.name))
	}
	if err := os.WriteFile(filepath.Join(boot, "syslinux.cfg"), []byte(syslinuxCfg), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(tmp, "disk.raw")
	writeDisk(t, tools, mbr, root, boot, raw)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	run(t, "", tools["qemu-img"], "convert", "-q", "-f", "raw", "-O", "qcow2", raw, filepath.Join(tmp, "guest.qcow2"))
	os.Remove(raw)
	sum, err := fileSHA256(filepath.Join(tmp, "guest.qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), []byte(sum+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest image: made in %s, cached in %s", time.Since(start).Round(time.Second), dir)
	PruneCache(cache, filepath.Base(dir), filepath.Base(filepath.Dir(cachedRoot)))
	img, ok := cached(dir)
	if !ok {
		t.Fatalf("guest image: %s is not complete after its build", dir)
	}
	return img
}

// PrepareRoot copies the cached root to root, writes files into it (path
// under the root: content, 0644) and runs each setup command in it
// (chroot, sh -c).
func PrepareRoot(t testing.TB, cachedRoot, root string, files map[string]string, setup []string) {
	t.Helper()
	run(t, "", "cp", "-a", cachedRoot, root)
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range setup {
		cmd := exec.Command("chroot", root, "/bin/sh", "-c", c)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("in the guest root: %s: %v\n%s", c, err, out)
		}
	}
}

// cached returns the image in dir when its build completed.
func cached(dir string) (Image, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "ok"))
	sum := strings.TrimSpace(string(b))
	if err != nil || len(sum) != 64 {
		return Image{}, false
	}
	TouchCache(dir)
	return Image{Path: filepath.Join(dir, "guest.qcow2"), SHA256: sum}, true
}

// writeDisk writes the raw disk: the MBR with syslinux's boot code and
// two partitions, a FAT with syslinux, the kernel and the initrd
// (partition 1, active), and the root as ext4 (partition 2), each file
// system written at its partition's offset.
func writeDisk(t testing.TB, tools map[string]string, mbr, root, boot, raw string) {
	t.Helper()
	du, err := exec.Command("du", "-sm", root).Output()
	if err != nil {
		t.Fatalf("du -sm %s: %v", root, err)
	}
	var rootMiB int64
	fmt.Sscan(string(du), &rootMiB)
	rootMiB += rootSlackMiB
	bootSectors := int64(bootMiB) << 20 / sector
	rootStart := bootStart + bootSectors
	rootSectors := rootMiB << 20 / sector
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate((rootStart + rootSectors) * sector); err != nil {
		t.Fatal(err)
	}
	f.Close()
	table := fmt.Sprintf("label: dos\nstart=%d, size=%d, type=c, bootable\nstart=%d, size=%d, type=83\n",
		bootStart, bootSectors, rootStart, rootSectors)
	cmd := exec.Command(tools["sfdisk"], "--quiet", "--no-reread", "--no-tell-kernel", raw)
	cmd.Stdin = strings.NewReader(table)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk %s: %v\n%s", raw, err, out)
	}
	// syslinux's MBR code: the first 440 bytes, before the table.
	code, err := os.ReadFile(mbr)
	if err != nil {
		t.Fatal(err)
	}
	if len(code) > 440 {
		t.Fatalf("%s is %d bytes, more than an MBR's 440 of code", mbr, len(code))
	}
	f, err = os.OpenFile(raw, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(code, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	bootOffset := fmt.Sprint(bootStart * sector)
	run(t, "", tools["mkfs.fat"], "-F", "16", "--offset", fmt.Sprint(bootStart), "-n", "BCDBOOT", raw, fmt.Sprint(bootSectors*sector/1024))
	run(t, "", tools["syslinux"], "--install", "--offset", bootOffset, raw)
	run(t, "", tools["mcopy"], "-i", raw+"@@"+bootOffset,
		filepath.Join(boot, "vmlinuz"), filepath.Join(boot, "initrd.img"), filepath.Join(boot, "syslinux.cfg"), "::/")
	run(t, "", tools["mkfs.ext4"], "-q", "-F", "-L", "bcdroot", "-E", "offset="+fmt.Sprint(rootStart*sector),
		"-d", root, raw, fmt.Sprintf("%dk", rootSectors*sector/1024))
}

func run(t testing.TB, dir string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// CacheKeep is how long a cached root or image no run used is kept:
// branches with other packages or setup share a cache.
const CacheKeep = 3 * 24 * time.Hour

// LockCache takes the lock of the cache directory (made when missing),
// so one test builds what another waits for; it returns the unlock.
func LockCache(t testing.TB, cache string) func() {
	t.Helper()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		t.Fatalf("flock %s: %v", lock.Name(), err)
	}
	return func() { lock.Close() }
}

// TouchCache marks a cached root or image (a directory whose file ok
// says it is complete) as used now.
func TouchCache(dir string) {
	now := time.Now()
	os.Chtimes(filepath.Join(dir, "ok"), now, now)
}

// PruneCache removes the cached roots and images of cache (root-*,
// image-*, and Suite-* of an older layout) other than those in use that
// no run used for CacheKeep.
func PruneCache(cache string, inUse ...string) {
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() || slices.Contains(inUse, n) ||
			!(strings.HasPrefix(n, "root-") || strings.HasPrefix(n, "image-") || strings.HasPrefix(n, Suite+"-")) {
			continue
		}
		if fi, err := os.Stat(filepath.Join(cache, n, "ok")); err == nil && time.Since(fi.ModTime()) < CacheKeep {
			continue
		}
		os.RemoveAll(filepath.Join(cache, n))
	}
}

// debootstrapRoot returns the cached root of base and packages.
func debootstrapRoot(t testing.TB, cache string) string {
	t.Helper()
	return DebootstrapRoot(t, filepath.Join(cache, rootKey()), base,
		[]string{"apt-get", "update", "-q"}, append([]string{"apt-get", "install", "-y", "-q", "--no-install-recommends"}, packages...), []string{"apt-get", "clean"})
}

// DebootstrapRoot returns dir/root, a root made by debootstrap
// --variant=minbase of Suite with include, then each command of then run
// in it (chroot, no service started), making it when dir has no
// complete one (the caller holds the cache's lock). Without the Debian
// mirror it skips through testenv.
func DebootstrapRoot(t testing.TB, dir string, include []string, then ...[]string) string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "ok")); err == nil {
		TouchCache(dir)
		return filepath.Join(dir, "root")
	}
	mirror := DebianMirror()
	if err := MirrorReachable(mirror); err != nil {
		testenv.Skip(t, "the Debian mirror %s is needed to build a guest (none cached in %s): %v", mirror, dir, err)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	args := []string{"--variant=minbase", "--include=" + strings.Join(include, ","), Suite, root, mirror}
	t.Logf("guest: debootstrap %s (once; cached in %s)", strings.Join(args, " "), dir)
	cmd := exec.Command("debootstrap", args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("debootstrap %s: %v\n%s", strings.Join(args, " "), err, tailOf(string(out), 4000))
	}
	// No service starts in the root while the commands run.
	policy := filepath.Join(root, "usr/sbin/policy-rc.d")
	if err := os.WriteFile(policy, []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range then {
		cmd := exec.Command("chroot", append([]string{root}, c...)...)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive"}
		if out, err := cmd.CombinedOutput(); err != nil {
			os.RemoveAll(tmp)
			t.Fatalf("in the guest root: %s: %v\n%s", strings.Join(c, " "), err, tailOf(string(out), 4000))
		}
	}
	if err := os.Remove(policy); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "ok"), []byte(mirror+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("guest: debootstrap took %s", time.Since(start).Round(time.Second))
	return filepath.Join(dir, "root")
}

// DebianMirror is $BCD_DEBIAN_MIRROR, else the first http(s) archive
// apt's sources name for Suite, else deb.debian.org.
func DebianMirror() string {
	if m := os.Getenv("BCD_DEBIAN_MIRROR"); m != "" {
		return strings.TrimSuffix(m, "/")
	}
	sources, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	for _, f := range append([]string{"/etc/apt/sources.list"}, sources...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var uris []string
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(l, "#") {
				continue
			}
			if v, ok := strings.CutPrefix(l, "URIs:"); ok {
				uris = append(uris, strings.Fields(v)...)
			}
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "deb" && !strings.HasPrefix(f[1], "[") && strings.HasPrefix(f[2], Suite) {
				uris = append(uris, f[1])
			}
		}
		for _, u := range uris {
			if strings.HasPrefix(u, "http") && !strings.Contains(u, "security") {
				return strings.TrimSuffix(u, "/")
			}
		}
	}
	return "http://deb.debian.org/debian"
}

// MirrorReachable says whether mirror serves Suite's Release file.
func MirrorReachable(mirror string) error {
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Head(mirror + "/dists/" + Suite + "/Release")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HEAD %s/dists/%s/Release: %s", mirror, Suite, resp.Status)
	}
	return nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
