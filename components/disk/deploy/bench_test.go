package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkDeploy writes the same zstd image onto the same target with
// deploy.Write and with `zstd -dc | dd` (the reference, skipped when zstd
// is not installed) in one run, and prints both throughputs and their
// ratio (the budget is at least 0.9).
//
// The target is a file in a temp dir, or $BCD_DEPLOY_BENCH_TARGET (a block
// device or file, overwritten). The image is 256 MiB
// ($BCD_DEPLOY_BENCH_MIB) of OS-like data.
func BenchmarkDeploy(b *testing.B) {
	size := 256
	if s := os.Getenv("BCD_DEPLOY_BENCH_MIB"); s != "" {
		fmt.Sscan(s, &size)
	}
	dir := b.TempDir()
	img := osImage(size * MiB)
	src := compress(b, img, Zstd)
	imgPath := filepath.Join(dir, "image.zst")
	if err := os.WriteFile(imgPath, src, 0o600); err != nil {
		b.Fatal(err)
	}
	digest := sum(src)
	target := os.Getenv("BCD_DEPLOY_BENCH_TARGET")
	if target == "" {
		target = filepath.Join(dir, "target.img")
	}
	b.Logf("image %d MiB, zstd %d bytes (%.1fx), target %s", size, len(src), float64(len(img))/float64(len(src)), target)

	rate, cpu := map[string]float64{}, map[string]float64{}
	// CPU time per run matters on a busy machine: this process's for
	// deploy.Write, the children's for the reference.
	run := func(name string, who int, write func() error) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(img)))
			var r0, r1 syscall.Rusage
			syscall.Getrusage(who, &r0)
			for b.Loop() {
				if err := write(); err != nil {
					b.Fatal(err)
				}
			}
			syscall.Getrusage(who, &r1)
			used := r1.Utime.Nano() - r0.Utime.Nano() + r1.Stime.Nano() - r0.Stime.Nano()
			cpu[name] = float64(used) / 1e6 / float64(b.N)
			b.ReportMetric(cpu[name], "cpu-ms/op")
			rate[name] = float64(len(img)) * float64(b.N) / b.Elapsed().Seconds() / 1e6
		})
	}
	run("bcd", syscall.RUSAGE_SELF, func() error {
		f, err := os.Open(imgPath)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = Write(context.Background(), f, digest, Auto, target, nil)
		return err
	})
	got, _ := os.ReadFile(target)
	if len(got) >= len(img) && !bytes.Equal(got[:len(img)], img) {
		b.Fatal("deploy.Write left something else on the target")
	}
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Logf("zstd is not installed: no zstd -dc | dd reference figure")
		fmt.Printf("deploy.image: %.0f MB/s; no zstd -dc | dd reference (zstd not installed)\n", rate["bcd"])
		return
	}
	run("zstd-dc-dd", syscall.RUSAGE_CHILDREN, func() error {
		cmd := exec.Command("sh", "-c", `zstd -q -dc -- "$1" | dd of="$2" bs=4M conv=fsync status=none`, "sh", imgPath, target)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("zstd -dc | dd: %v: %s", err, out)
		}
		return nil
	})
	if rate["bcd"] > 0 && rate["zstd-dc-dd"] > 0 {
		fmt.Printf("deploy.image: %.0f MB/s (%.0f ms CPU), zstd -dc | dd: %.0f MB/s (%.0f ms CPU), ratio %.2f (budget >= 0.90), %d MiB image onto %s, %s\n",
			rate["bcd"], cpu["bcd"], rate["zstd-dc-dd"], cpu["zstd-dc-dd"], rate["bcd"]/rate["zstd-dc-dd"], size, target, time.Now().Format(time.RFC3339))
	}
}
