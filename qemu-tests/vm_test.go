package qemutests

import (
	"bufio"
	"context"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Deadlines, about 3x what the lab measured under TCG on a loaded 2-core
// machine (init at 6-10 s, module loading about 1 s). At a load average of
// 18 on 2 cores (a CI run beside six engineers' tests) the kernel reached
// init at 29.6 s, so init gets 60 s.
const (
	initDeadline  = 60 * time.Second
	totalDeadline = 90 * time.Second
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod above qemu-tests: %v", err)
	}
	return dir
}

// need fails under CI and skips elsewhere, loudly either way.
func need(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	testenv.Skip(t, "QEMU test: %s: %v (apt-get install -y --no-install-recommends qemu-system-x86 linux-image-amd64)", what, err)
}

// prerequisites returns qemu-system-x86_64 and the image directory, or
// skips (fails under CI) without them.
func prerequisites(t *testing.T) (qemu, image string) {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	need(t, "qemu-system-x86_64", err)
	if ks, _ := filepath.Glob("/boot/vmlinuz-*"); len(ks) == 0 {
		need(t, "an installed kernel", fmt.Errorf("no /boot/vmlinuz-*"))
	}
	return qemu, imageDir(t, repoRoot(t))
}

// imageDir returns a directory holding vmlinuz and initramfs.cpio.zst.
func imageDir(t *testing.T, repo string) string {
	t.Helper()
	if dir := os.Getenv("BCD_RAMDISK_DIR"); dir != "" {
		t.Logf("image: $BCD_RAMDISK_DIR=%s", dir)
		return dir
	}
	out := filepath.Join(repo, "images", "out")
	stale := staleness(repo, out)
	if stale == "" {
		t.Logf("image: %s is newer than the sources, using it", out)
		return out
	}
	t.Logf("image: building into %s (%s)", out, stale)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./images/ramdisk", "-out", out)
	cmd.Dir = repo
	b, err := cmd.CombinedOutput()
	t.Logf("go run ./images/ramdisk:\n%s", b)
	if err != nil {
		t.Fatalf("building the ramdisk image: %v", err)
	}
	return out
}

// staleness says why out needs a rebuild, or "" when its initramfs is newer
// than every Go source, go.mod, go.sum and installed kernel.
func staleness(repo, out string) string {
	st, err := os.Stat(filepath.Join(out, "initramfs.cpio.zst"))
	if err != nil {
		return "no initramfs.cpio.zst yet"
	}
	if _, err := os.Stat(filepath.Join(out, "vmlinuz")); err != nil {
		return "no vmlinuz yet"
	}
	if _, err := os.Stat(filepath.Join(out, "os.img.zst")); err != nil {
		return "no os.img.zst yet"
	}
	built := st.ModTime()
	newer := ""
	filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil || newer != "" {
			return filepath.SkipDir
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "out", "qemu-tests", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		n := d.Name()
		if strings.HasSuffix(n, ".go") || n == "go.mod" || n == "go.sum" {
			if info, err := d.Info(); err == nil && info.ModTime().After(built) {
				newer = p
			}
		}
		return nil
	})
	if newer != "" {
		return newer + " changed since"
	}
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	for _, k := range ks {
		if info, err := os.Stat(k); err == nil && info.ModTime().After(built) {
			return k + " is newer"
		}
	}
	return ""
}

// accel picks TCG: KVM hangs on the lab machines, so it is used only when
// asked for with BCD_QEMU_ACCEL=kvm.
func accel(t *testing.T) string {
	_, kvmErr := os.Stat("/dev/kvm")
	if os.Getenv("BCD_QEMU_ACCEL") == "kvm" {
		if kvmErr != nil {
			t.Fatalf("BCD_QEMU_ACCEL=kvm but %v", kvmErr)
		}
		return "kvm"
	}
	if kvmErr == nil {
		t.Logf("/dev/kvm exists; using TCG anyway (BCD_QEMU_ACCEL=kvm to try KVM)")
	}
	return "tcg"
}

// sparseDisk makes a sparse disk file of size bytes.
func sparseDisk(t *testing.T, name string, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}

type line struct {
	at   time.Duration
	text string
}

// boot is one VM run: its console, and when marked lines first appeared.
type boot struct {
	log   []line
	seen  map[string]time.Duration
	accel string
}

// console is the whole serial console.
func (b *boot) console() string {
	var s strings.Builder
	for _, l := range b.log {
		s.WriteString(l.text + "\n")
	}
	return s.String()
}

// after returns the rest of the first console line holding prefix.
func (b *boot) after(prefix string) string {
	for _, l := range b.log {
		if i := strings.Index(l.text, prefix); i >= 0 {
			return l.text[i+len(prefix):]
		}
	}
	return ""
}

func (b *boot) dump(t *testing.T) {
	t.Helper()
	var s strings.Builder
	for _, l := range b.log {
		fmt.Fprintf(&s, "%6.2fs %s\n", l.at.Seconds(), l.text)
	}
	t.Logf("serial console:\n%s", s.String())
}

// marks are console lines whose first appearance is timed.
var marks = map[string]string{
	"kernel init": "Run /init as init process",
	"u-root":      "Welcome to u-root!",
	"init":        "bcd-ramdisk: init started",
	"poweroff":    "reboot: Power down",
}

// runVM boots the image with extra QEMU arguments and returns once QEMU
// exited. It fails the test when the init (a console line holding
// initMark) does not print within initDeadline or QEMU outlives
// totalDeadline or fails.
func runVM(t *testing.T, qemu, kernel, initrd, initMark string, extra ...string) *boot {
	t.Helper()
	b := &boot{seen: map[string]time.Duration{}, accel: accel(t)}
	args := append([]string{
		"-machine", "q35", "-accel", b.accel, "-cpu", "max", "-smp", "1", "-m", "512",
		"-nographic", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 bc.gateway=https://127.0.0.1:1 bc.test=1",
	}, extra...)
	ctx, cancel := context.WithTimeout(context.Background(), totalDeadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	t.Logf("%s %s", qemu, strings.Join(args, " "))
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan line, 10000)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- line{time.Since(start), strings.TrimRight(s.Text(), "\r")}
		}
		close(lines)
	}()
	initTimer := time.NewTimer(initDeadline)
	defer initTimer.Stop()
read:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				break read
			}
			b.log = append(b.log, l)
			for key, substr := range marks {
				if _, ok := b.seen[key]; !ok && strings.Contains(l.text, substr) {
					b.seen[key] = l.at
				}
			}
			if strings.Contains(l.text, initMark) {
				initTimer.Stop()
			}
		case <-initTimer.C:
			cancel()
			b.dump(t)
			t.Fatalf("the init did not print %q within %v of QEMU starting", initMark, initDeadline)
		}
	}
	werr := cmd.Wait()
	if ctx.Err() != nil {
		b.dump(t)
		t.Fatalf("QEMU still running after %v: killed", totalDeadline)
	}
	if werr != nil {
		b.dump(t)
		t.Fatalf("QEMU: %v", werr)
	}
	return b
}
