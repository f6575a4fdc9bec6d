package xid

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// FaultsFile is the store's file under the data directory.
const FaultsFile = "faults.json"

// MaxEvents bounds the events a Store keeps; past it the oldest are
// dropped, so a GPU that logs the same Xid in a loop cannot grow the file
// without end.
const MaxEvents = 1024

// Store holds this boot's Xid events and saves them in
// data_dir/faults.json. It is safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	path   string
	bootID string
	events []Event
	// cleared is, per GPU (normalized bus id), the kernel timestamp of the
	// newest event a reset cleared: /dev/kmsg holds those records for the
	// rest of the boot, and reading them again must not bring them back.
	cleared map[string]time.Duration
}

// faults is the JSON form of faults.json.
type faults struct {
	BootID string  `json:"boot_id"`
	XIDs   []fault `json:"xids"`
	// Cleared is the per-GPU mark of Store.cleared, in microseconds.
	Cleared map[string]int64 `json:"cleared_through_us,omitempty"`
}

type fault struct {
	Code     int    `json:"code"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	Message  string `json:"message,omitempty"`
	AtUsec   int64  `json:"at_us,omitempty"`
}

// Load reads dataDir/faults.json for the boot bootID (the kernel's
// /proc/sys/kernel/random/boot_id). Events recorded in another boot are
// dropped; a missing file is an empty store. Nothing is written until Save.
func Load(dataDir, bootID string) (*Store, error) {
	if bootID == "" {
		return nil, errors.New("loading Xid faults: no boot id")
	}
	s := &Store{path: filepath.Join(dataDir, FaultsFile), bootID: bootID, cleared: map[string]time.Duration{}}
	raw, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Xid faults: %w", err)
	}
	var f faults
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", s.path, err)
	}
	if f.BootID != bootID {
		return s, nil
	}
	for bus, us := range f.Cleared {
		s.cleared[bus] = time.Duration(us) * time.Microsecond
	}
	for _, x := range f.XIDs {
		s.add(Event{Code: x.Code, PCIBusID: x.PCIBusID, Message: x.Message, At: time.Duration(x.AtUsec) * time.Microsecond})
	}
	return s, nil
}

// BootID returns the boot the store's events belong to.
func (s *Store) BootID() string { return s.bootID }

// Add records events not already held (an event identical in code, GPU,
// message and timestamp is the same kernel record read again) and returns
// how many were new.
func (s *Store) Add(events ...Event) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range events {
		if s.add(ev) {
			n++
		}
	}
	return n
}

func (s *Store) add(ev Event) bool {
	if mark, ok := s.cleared[normalize(ev.PCIBusID)]; ok && ev.At > 0 && ev.At <= mark {
		return false // a record a reset already cleared, read again
	}
	for _, have := range s.events {
		if have == ev {
			return false
		}
	}
	s.events = append(s.events, ev)
	if len(s.events) > MaxEvents {
		s.events = append(s.events[:0], s.events[len(s.events)-MaxEvents:]...)
	}
	return true
}

// Events returns a copy of the events held, oldest first.
func (s *Store) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// ForGPU returns the events of the GPU at pciBusID, oldest first. The
// address may be written as nvidia-smi does ("00000000:17:00.0").
func (s *Store) ForGPU(pciBusID string) []Event {
	key := normalize(pciBusID)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Event
	for _, ev := range s.events {
		if normalize(ev.PCIBusID) == key {
			out = append(out, ev)
		}
	}
	return out
}

// Clear forgets the events of the GPU at pciBusID, after a reset left it
// healthy, and returns how many it dropped. The address may be written as
// nvidia-smi does ("00000000:17:00.0").
func (s *Store) Clear(pciBusID string) int {
	key := normalize(pciBusID)
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.events[:0]
	for _, ev := range s.events {
		if normalize(ev.PCIBusID) != key {
			kept = append(kept, ev)
		} else if ev.At > s.cleared[key] {
			if s.cleared == nil {
				s.cleared = map[string]time.Duration{}
			}
			s.cleared[key] = ev.At
		}
	}
	n := len(s.events) - len(kept)
	clear(s.events[len(kept):])
	s.events = kept
	return n
}

// Save writes faults.json atomically (a temporary file renamed over it),
// mode 0600.
func (s *Store) Save() error {
	s.mu.Lock()
	f := faults{BootID: s.bootID, XIDs: make([]fault, 0, len(s.events))}
	for bus, at := range s.cleared {
		if f.Cleared == nil {
			f.Cleared = map[string]int64{}
		}
		f.Cleared[bus] = int64(at / time.Microsecond)
	}
	for _, ev := range s.events {
		f.XIDs = append(f.XIDs, fault{Code: ev.Code, PCIBusID: ev.PCIBusID, Message: ev.Message, AtUsec: int64(ev.At / time.Microsecond)})
	}
	s.mu.Unlock()
	raw, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding Xid faults: %w", err)
	}
	return writeAtomic(s.path, append(raw, '\n'))
}

// writeAtomic writes data to a temporary file (0600) beside path, syncs
// it and renames it over path.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("creating a temporary file for %s: %w", path, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("chmod %s 0600: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		done = true
		return fmt.Errorf("rename %s %s: %w", tmp.Name(), path, err)
	}
	done = true
	return nil
}

// normalize keys a GPU address the way the kernel writes it: lower case, a
// four-digit domain, no function ("00000000:17:00.0" is "0000:17:00").
func normalize(id string) string {
	id = strings.ToLower(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(id), "PCI:")))
	id, _, _ = strings.Cut(id, ".")
	dom, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(dom) > 4 && strings.Trim(dom[:len(dom)-4], "0") == "" {
		dom = dom[len(dom)-4:]
	}
	return dom + ":" + rest
}
