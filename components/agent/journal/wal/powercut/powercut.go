// Package powercut is a file for durability tests that behaves as a disk
// behind a page cache does across a power cut (the approach of LazyFS):
// what is written stays in memory until Datasync writes it to the real
// file and fdatasyncs it; Cut drops whatever was not synced and refuses
// every later write and sync, as a machine that lost power would. The
// real file then holds exactly what a disk would after the cut, so a test
// reads it back without trusting the writer's own count of what it synced.
package powercut

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// ErrPowerCut is the error of every write and sync after Cut.
var ErrPowerCut = errors.New("the power was cut")

// A File is a file whose writes are durable only once synced.
type File struct {
	mu      sync.Mutex
	f       *os.File
	pending []write
	cut     bool
}

type write struct {
	off int64
	b   []byte
}

// Create makes a new file at path (it must not exist).
func Create(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &File{f: f}, nil
}

// WriteAt keeps a copy of b for off until the next Datasync.
func (f *File) WriteAt(b []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return 0, ErrPowerCut
	}
	f.pending = append(f.pending, write{off, append([]byte(nil), b...)})
	return len(b), nil
}

// Datasync writes what was written since the last one to the real file,
// in order, and fdatasyncs it.
func (f *File) Datasync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return ErrPowerCut
	}
	for _, w := range f.pending {
		if _, err := f.f.WriteAt(w.b, w.off); err != nil {
			return fmt.Errorf("powercut: %w", err)
		}
	}
	f.pending = nil
	return syscall.Fdatasync(int(f.f.Fd()))
}

// Unsynced is how many bytes were written since the last Datasync.
func (f *File) Unsynced() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.pending {
		n += len(w.b)
	}
	return n
}

// Cut loses what was not synced; every later write and sync fails.
func (f *File) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending, f.cut = nil, true
}

// Close closes the real file (what was not synced stays lost).
func (f *File) Close() error { return f.f.Close() }
