package xid

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var (
	fellOff = Event{Code: 79, PCIBusID: "0000:17:00", Message: "GPU has fallen off the bus.", At: 9 * time.Second}
	dbe     = Event{Code: 48, PCIBusID: "0000:3b:00", Message: "An uncorrectable double bit error", At: 10 * time.Second}
	remap   = Event{Code: 63, PCIBusID: "0000:3b:00", Message: "Row Remapper: New row marked for remapping", At: 11 * time.Second}
)

func TestStore(t *testing.T) {
	const boot, nextBoot = "2b1e5b0c-8a51-4b57-9d35-0d7a5f6c1e01", "7f00c8d9-3e4a-4c1b-8e2f-91a0b2c3d4e5"
	tests := []struct {
		name  string
		steps func(t *testing.T, dir string) *Store
		want  []Event
	}{
		{
			name: "round trip in the same boot",
			steps: func(t *testing.T, dir string) *Store {
				s := mustLoad(t, dir, boot)
				if n := s.Add(fellOff, dbe); n != 2 {
					t.Errorf("Add = %d, want 2", n)
				}
				mustSave(t, s)
				return mustLoad(t, dir, boot)
			},
			want: []Event{fellOff, dbe},
		},
		{
			name: "another boot starts empty",
			steps: func(t *testing.T, dir string) *Store {
				s := mustLoad(t, dir, boot)
				s.Add(fellOff)
				mustSave(t, s)
				return mustLoad(t, dir, nextBoot)
			},
			want: nil,
		},
		{
			name: "identical events dedupe, across a restart too",
			steps: func(t *testing.T, dir string) *Store {
				s := mustLoad(t, dir, boot)
				s.Add(fellOff, fellOff, dbe)
				mustSave(t, s)
				s = mustLoad(t, dir, boot)
				if n := s.Add(fellOff, dbe, remap); n != 1 {
					t.Errorf("Add after reload = %d, want 1", n)
				}
				same := fellOff
				same.At += time.Second // the same Xid logged again later is a new event
				if n := s.Add(same); n != 1 {
					t.Errorf("Add of a later record = %d, want 1", n)
				}
				s.Clear("0000:17:00")
				return s
			},
			want: []Event{dbe, remap},
		},
		{
			name: "clear after a reset, with nvidia-smi's address",
			steps: func(t *testing.T, dir string) *Store {
				s := mustLoad(t, dir, boot)
				s.Add(fellOff, dbe, remap)
				if n := s.Clear("00000000:3B:00.0"); n != 2 {
					t.Errorf("Clear = %d, want 2", n)
				}
				if got := s.ForGPU("0000:3b:00"); len(got) != 0 {
					t.Errorf("ForGPU after Clear = %+v", got)
				}
				if got := s.ForGPU("00000000:17:00.0"); !reflect.DeepEqual(got, []Event{fellOff}) {
					t.Errorf("ForGPU(17) = %+v", got)
				}
				mustSave(t, s)
				return mustLoad(t, dir, boot)
			},
			want: []Event{fellOff},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.steps(t, t.TempDir())
			if got := s.Events(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Events()\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestStoreFile(t *testing.T) {
	dir := t.TempDir()
	s := mustLoad(t, dir, "b1")
	s.Add(fellOff)
	mustSave(t, s)
	path := filepath.Join(dir, FaultsFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		BootID string           `json:"boot_id"`
		XIDs   []map[string]any `json:"xids"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if f.BootID != "b1" || len(f.XIDs) != 1 || f.XIDs[0]["code"] != float64(79) || f.XIDs[0]["pci_bus_id"] != "0000:17:00" || f.XIDs[0]["at_us"] != float64(9e6) {
		t.Errorf("faults.json = %s", raw)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("data dir holds %d entries, want faults.json alone", len(entries))
	}
}

func TestStoreErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir, ""); err == nil {
		t.Error("Load with no boot id succeeded")
	}
	if err := os.WriteFile(filepath.Join(dir, FaultsFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir, "b1"); err == nil || !strings.Contains(err.Error(), FaultsFile) {
		t.Errorf("Load of a corrupt file: %v", err)
	}
	s := mustLoad(t, filepath.Join(dir, "missing"), "b1")
	s.Add(fellOff)
	if err := s.Save(); err == nil {
		t.Error("Save into a missing directory succeeded")
	}
}

func TestStoreCap(t *testing.T) {
	s := mustLoad(t, t.TempDir(), "b1")
	for i := range MaxEvents + 10 {
		s.Add(Event{Code: 13, PCIBusID: "0000:17:00", At: time.Duration(i)})
	}
	got := s.Events()
	if len(got) != MaxEvents || got[0].At != 10 || got[len(got)-1].At != MaxEvents+9 {
		t.Errorf("kept %d events from %v to %v", len(got), got[0].At, got[len(got)-1].At)
	}
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"0000:17:00":       "0000:17:00",
		"00000000:17:00.0": "0000:17:00",
		"PCI:0000:3B:00":   "0000:3b:00",
		"00010000:17:00.0": "00010000:17:00",
		"":                 "",
	} {
		if got := normalize(in); got != want {
			t.Errorf("normalize(%q) = %q, want %q", in, got, want)
		}
	}
}

func mustLoad(t *testing.T, dir, boot string) *Store {
	t.Helper()
	s, err := Load(dir, boot)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustSave(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Save(); err != nil {
		t.Fatal(err)
	}
}

// TestClearedStaysCleared: /dev/kmsg keeps a boot's records, so after a
// reset cleared a GPU the same records read again do not bring its Xids
// back, across a Save and Load too; a newer Xid does.
func TestClearedStaysCleared(t *testing.T) {
	dir := t.TempDir()
	s, err := Load(dir, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	old := Event{Code: 79, PCIBusID: "0000:17:00", Message: "fallen off", At: 5 * time.Second}
	other := Event{Code: 48, PCIBusID: "0000:18:00", Message: "dbe", At: 4 * time.Second}
	s.Add(old, other)
	if n := s.Clear("00000000:17:00.0"); n != 1 {
		t.Fatalf("Clear = %d", n)
	}
	if n := s.Add(old, other); n != 0 || len(s.ForGPU("0000:17:00")) != 0 {
		t.Fatalf("the cleared record came back: Add = %d", n)
	}
	if err := s.Save(); err != nil {
		t.Fatal(err)
	}
	s2, err := Load(dir, "boot-1")
	if err != nil {
		t.Fatal(err)
	}
	if n := s2.Add(old); n != 0 {
		t.Error("after Load the cleared record came back")
	}
	newer := Event{Code: 79, PCIBusID: "0000:17:00", Message: "fallen off", At: 9 * time.Second}
	if n := s2.Add(newer); n != 1 || len(s2.ForGPU("0000:17:00")) != 1 {
		t.Error("a newer Xid after the reset was not taken")
	}
	if len(s2.ForGPU("0000:18:00")) != 1 {
		t.Error("another GPU's Xid was cleared")
	}
	// A new boot starts clean, marks included.
	s3, _ := Load(dir, "boot-2")
	if n := s3.Add(old); n != 1 {
		t.Error("a new boot kept the old boot's mark")
	}
}
