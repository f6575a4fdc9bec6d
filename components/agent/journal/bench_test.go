package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkCommand is one command's journal life (accept, start, finish:
// three durable writes) with c commands in flight at once, as when a
// burst of commands reaches an agent's lanes. Group commit lets writes
// that arrive together share one commit; fsyncs/command counts bbolt's
// fdatasyncs (two per commit) per command. Its reference is
// BenchmarkRawFsync in the same kind of directory: make bench prints both
// in its table (cmd/benchtable).
func BenchmarkCommand(b *testing.B) {
	for _, c := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) { benchCommands(b, c) })
	}
}

func benchCommands(b *testing.B, c int) {
	j, _, err := Open(filepath.Join(b.TempDir(), File), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
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
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
	b.ReportMetric(2*float64(st.Commits-before.Commits)/float64(b.N), "fsyncs/command")
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
