package journal

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCommand is one command's journal life (accept, start, finish:
// three fsynced transactions). Its reference is BenchmarkRawFsync in the
// same directory: make bench prints both.
func BenchmarkCommand(b *testing.B) {
	dir := b.TempDir()
	j, _, err := Open(filepath.Join(dir, File), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	result := make([]byte, 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("cmd_%d", i)
		if _, _, err := j.Accept(id, "k", "control", result); err != nil {
			b.Fatal(err)
		}
		if err := j.Start(id); err != nil {
			b.Fatal(err)
		}
		if err := j.Finish(id, result); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
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
