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

// BenchmarkDeploy writes the same image onto the same target with
// deploy.Write and with the command-line reference in one run: a zstd
// image against `zstd -dc | dd`, a gzip image against `gzip -dc | dd`
// (each skipped when its tool is not installed). It prints both
// throughputs and CPU times and their ratio (the budget is at least 0.9);
// make bench's table (cmd/benchtable) reads the benchmark lines. The zstd
// image is also written with 1 and 4 decoder goroutines, for the plot.
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
	target := os.Getenv("BCD_DEPLOY_BENCH_TARGET")
	if target == "" {
		target = filepath.Join(dir, "target.img")
	}
	for _, c := range []Compression{Zstd, Gzip} {
		b.Run(string(c), func(b *testing.B) { benchDeploy(b, img, c, dir, target, size) })
	}
}

func benchDeploy(b *testing.B, img []byte, c Compression, dir, target string, size int) {
	src := compress(b, img, c)
	imgPath := filepath.Join(dir, "image."+string(c))
	if err := os.WriteFile(imgPath, src, 0o600); err != nil {
		b.Fatal(err)
	}
	digest := sum(src)
	b.Logf("image %d MiB, %s %d bytes (%.1fx), target %s", size, c, len(src), float64(len(img))/float64(len(src)), target)

	tool := string(c) // zstd, gzip
	ref := tool + "-dc-dd"
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
	bcd := func(name string) {
		run(name, syscall.RUSAGE_SELF, func() error {
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
	}
	if _, err := exec.LookPath(tool); err != nil {
		b.Logf("%s is not installed: no %s -dc | dd reference figure", tool, tool)
		bcd("bcd")
		fmt.Printf("deploy.image %s: %.0f MB/s; no %s -dc | dd reference (%s not installed)\n", c, rate["bcd"], tool, tool)
		return
	}
	reference := func() {
		run(ref, syscall.RUSAGE_CHILDREN, func() error {
			cmd := exec.Command("sh", "-c", tool+` -q -dc -- "$1" | dd of="$2" bs=4M conv=fsync status=none`, "sh", imgPath, target)
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("%s -dc | dd: %v: %s", tool, err, out)
			}
			return nil
		})
	}
	// The reference first, then bcd: neither always has the page cache's
	// leftovers of the other.
	reference()
	bcd("bcd")
	if c == Zstd {
		// The curve over decoder goroutines (make bench's deploy.png); "bcd"
		// is the default, zstdConcurrency.
		def := zstdConcurrency
		for _, n := range []int{1, 4} {
			zstdConcurrency = n
			bcd(fmt.Sprintf("bcd-goroutines=%d", n))
		}
		zstdConcurrency = def
	}
	if rate["bcd"] > 0 && rate[ref] > 0 {
		fmt.Printf("deploy.image %s: %.0f MB/s (%.0f ms CPU), %s -dc | dd: %.0f MB/s (%.0f ms CPU), ratio %.2f (budget >= 0.90), %d MiB image onto %s, %s\n",
			c, rate["bcd"], cpu["bcd"], tool, rate[ref], cpu[ref], rate["bcd"]/rate[ref], size, target, time.Now().Format(time.RFC3339))
	}
}
