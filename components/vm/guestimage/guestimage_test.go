package guestimage

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/vm/seed"
)

// TestBootsOnItsOwn: the image, as an overlay's base, boots under QEMU
// with its default firmware (SeaBIOS, no -kernel) and cloud-init runs
// the user data of a NoCloud seed written by components/vm/seed: the
// nonce its runcmd prints reaches the serial console.
func TestBootsOnItsOwn(t *testing.T) {
	img := Cached(t)
	qemu := testenv.NeedTool(t, "qemu-system-x86_64", "qemu-system-x86")
	qemuImg := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-b", img.Path, "-F", "qcow2", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	b := make([]byte, 8)
	rand.Read(b)
	nonce := "bcd-nonce-" + hex.EncodeToString(b)
	if err := seed.WriteFile(filepath.Join(dir, "seed.iso"), seed.Seed{InstanceID: "vm-boot",
		UserData: []byte("#cloud-config\nruncmd:\n  - echo " + nonce + " > /dev/ttyS0\n")}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(qemu, "-machine", "q35", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1",
		"-nodefaults", "-display", "none", "-serial", "stdio", "-no-reboot",
		"-drive", "file="+disk+",if=virtio,format=qcow2",
		"-drive", "file="+filepath.Join(dir, "seed.iso")+",media=cdrom,format=raw",
		"-device", "virtio-rng-pci")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var console []string
	timeout := time.After(10 * time.Minute)
	found := false
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("QEMU ended before the nonce (%s):\n%s", time.Since(start), strings.Join(console, "\n"))
			}
			console = append(console, l)
			if strings.Contains(l, nonce) && !strings.Contains(l, "echo") {
				t.Logf("nonce on the console %s after QEMU started", time.Since(start).Round(time.Second))
				found = true
			}
			if found && strings.Contains(l, "Cloud-init") && strings.Contains(l, "finished") {
				t.Logf("cloud-init finished %s after QEMU started: %s", time.Since(start).Round(time.Second), l)
				t.Logf("console:\n%s", strings.Join(console, "\n"))
				return
			}
		case <-timeout:
			t.Fatalf("no nonce within 10 minutes:\n%s", strings.Join(console, "\n"))
		}
	}
}
