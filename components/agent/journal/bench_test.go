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

// BenchmarkCommand is one command's journal life as the agent lives it
// (accepted and started in one durable write, finished in another, its
// ack written but not synced) with c commands in flight at once, as when
// a burst of commands reaches an agent's lanes. Group commit lets writes
// that arrive together share one commit: one log write and one fdatasync;
// fsyncs/command counts every fsync and fdatasync the journal issued (the
// commits', the segments' and the snapshots') per command: a count, which
// the machine's load does not change.
//
// The reference is raw write+fsync/s in the same directory, interleaved
// with the measured run: the run is cut in rounds, and after each round
// the raw loop runs for as long as the round took, with the timer
// stopped. raw-fsyncs/s is over the same total time as commands/s, and
// x-raw-fsync is their ratio (on a shared machine the raw rate alone
// swings by half within a minute).
func BenchmarkCommand(b *testing.B) {
	for _, c := range []int{1, 4, 16, 32, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchCommands(b, c) })
	}
}

// benchRounds is how many rounds a run is cut in, each followed by as
// long of the raw fsync loop.
const benchRounds = 8

func benchCommands(b *testing.B, c int) {
	dir := b.TempDir()
	j, _, err := Open(filepath.Join(dir, File), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	result := make([]byte, 200)
	before := j.Stats()
	var next atomic.Int64
	errs := make(chan error, c)
	var measured, rawTime time.Duration
	rawN := 0
	b.ResetTimer()
	for round := 1; round <= benchRounds; round++ {
		end := int64(b.N) * int64(round) / benchRounds
		t0 := time.Now()
		var wg sync.WaitGroup
		for g := 0; g < c; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= end {
						next.Add(-1)
						return
					}
					id := fmt.Sprintf("cmd_%d", i)
					if _, _, err := j.AcceptStarted(id, "k", "control", result, time.Time{}); err != nil {
						errs <- err
						return
					}
					if err := j.Finish(id, result); err != nil {
						errs <- err
						return
					}
					j.AckResult(id)
				}
			}()
		}
		wg.Wait()
		took := time.Since(t0)
		measured += took
		b.StopTimer()
		n, d := rawFsyncs(b, dir, took)
		rawN, rawTime = rawN+n, rawTime+d
		b.StartTimer()
	}
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	st := j.Stats()
	cmds := float64(b.N) / measured.Seconds()
	raw := float64(rawN) / rawTime.Seconds()
	b.ReportMetric(cmds, "commands/s")
	b.ReportMetric(float64(st.Syncs-before.Syncs)/float64(b.N), "fsyncs/command")
	b.ReportMetric(float64(st.Writes-before.Writes)/float64(max(1, st.Commits-before.Commits)), "writes/commit")
	b.ReportMetric(raw, "raw-fsyncs/s")
	b.ReportMetric(cmds/raw, "x-raw-fsync")
}

// rawFsyncs is BenchmarkRawFsync's loop, in dir, for d (at least one
// round): 200-byte appends, each fsynced. It returns how many and the time
// they took.
func rawFsyncs(b *testing.B, dir string, d time.Duration) (int, time.Duration) {
	f, err := os.CreateTemp(dir, "raw")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 200)
	n, start := 0, time.Now()
	for n == 0 || time.Since(start) < d {
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		n++
	}
	return n, time.Since(start)
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
