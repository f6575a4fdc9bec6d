package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkCommand is one command's journal life (accept, start, finish:
// three durable writes) with c commands in flight at once, as when a
// burst of commands reaches an agent's lanes. Group commit lets writes
// that arrive together share one commit: one log write and one fdatasync;
// fsyncs/command counts every fsync and fdatasync the journal issued (the
// commits' and the snapshots') per command. Its reference is
// BenchmarkRawFsync in the same kind of directory: make bench prints both
// in its table (cmd/benchtable).
//
// Each run also measures raw write+fsync/s in the same directory for a
// quarter second before and after its timed part (raw-fsyncs/s), so the
// ratio is taken against the disk as it was during that run: on a shared
// machine the raw rate alone swings by half within a minute.
func BenchmarkCommand(b *testing.B) {
	for _, c := range []int{1, 4, 16, 32, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchCommands(b, c) })
	}
}

func benchCommands(b *testing.B, c int) {
	dir := b.TempDir()
	j, _, err := Open(filepath.Join(dir, File), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	rawBefore := rawFsyncRate(b, dir, time.Second/4)
	result := make([]byte, 200)
	before := j.Stats()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, c)
	b.ResetTimer()
	for g := 0; g < c; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				id := fmt.Sprintf("cmd_%d", i)
				if _, _, err := j.Accept(id, "k", "control", result); err != nil {
					errs <- err
					return
				}
				if err := j.Start(id); err != nil {
					errs <- err
					return
				}
				if err := j.Finish(id, result); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	st := j.Stats()
	elapsed := b.Elapsed()
	raw := (rawBefore + rawFsyncRate(b, dir, time.Second/4)) / 2
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commands/s")
	b.ReportMetric(float64(st.Syncs-before.Syncs)/float64(b.N), "fsyncs/command")
	b.ReportMetric(float64(st.Writes-before.Writes)/float64(st.Commits-before.Commits), "writes/commit")
	b.ReportMetric(raw, "raw-fsyncs/s")
}

// rawFsyncRate is BenchmarkRawFsync's loop, in dir, for d: 200-byte
// appends, each fsynced, per second.
func rawFsyncRate(b *testing.B, dir string, d time.Duration) float64 {
	f, err := os.CreateTemp(dir, "raw")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 200)
	n, start := 0, time.Now()
	for time.Since(start) < d {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// BenchmarkRawFsync is the reference: a 200-byte write and fsync of a file
// in the same kind of directory.
func BenchmarkRawFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "fsyncs/s")
}

// BenchmarkRawCommit is what one bbolt commit asked of the disk (the
// journal of the releases before the write-ahead log), without bbolt: a
// 4 KiB page written into a file grown by truncate (as bbolt grows its
// file) and fdatasynced, then a 4 KiB meta page overwritten and
// fdatasynced. Kept as the figure the log's one fdatasync replaced.
func BenchmarkRawCommit(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	if err := f.Truncate(int64(b.N+1) * 4096); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(page, int64(i+1)*4096); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		if _, err := f.WriteAt(page, 0); err != nil {
			b.Fatal(err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commits/s")
}
