package pressure

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

const (
	cpuPSI    = "some avg10=1.50 avg60=2.25 avg300=3.00 total=100\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
	memoryPSI = "some avg10=4.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=3.50 avg60=0.00 avg300=0.00 total=4\n"
	ioPSI     = "some avg10=6.00 avg60=0.00 avg300=0.00 total=7\nfull avg10=5.50 avg60=0.00 avg300=0.00 total=6\n"
	stat1     = "cpu  1000 0 0 0 0 0 0 100 0 0\n"
	stat2     = "cpu  1300 0 0 0 0 0 0 200 0 0\n" // 400 ticks later, 100 of them stolen
)

// procTree writes files (relative path -> content) under a temp dir.
func procTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSampler(t *testing.T) {
	full := map[string]string{"pressure/cpu": cpuPSI, "pressure/memory": memoryPSI, "pressure/io": ioPSI, "stat": stat1}
	with := func(change map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range full {
			m[k] = v
		}
		for k, v := range change {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	type psi struct {
		available                bool
		cpu10, cpu60             float64
		mem10, memFull, io10, io float64
	}
	type want struct {
		psi
		steal float64 // of the second sample
		err   string  // a substring of the first sample's error; "" for none
	}
	tests := []struct {
		name  string
		files map[string]string
		want  want
	}{
		{
			name:  "PSI and steal",
			files: full,
			want:  want{psi: psi{available: true, cpu10: 1.5, cpu60: 2.25, mem10: 4, memFull: 3.5, io10: 6, io: 5.5}, steal: 25},
		},
		{
			name:  "cpu without a full line (before Linux 5.13)",
			files: with(map[string]string{"pressure/cpu": "some avg10=1.50 avg60=2.25 avg300=3.00 total=100\n"}),
			want:  want{psi: psi{available: true, cpu10: 1.5, cpu60: 2.25, mem10: 4, memFull: 3.5, io10: 6, io: 5.5}, steal: 25},
		},
		{
			name:  "no /proc/pressure: not available, not an error, steal still read",
			files: map[string]string{"stat": stat1},
			want:  want{psi: psi{}, steal: 25},
		},
		{
			name:  "a malformed memory file",
			files: with(map[string]string{"pressure/memory": "some avg10=oops\n"}),
			want:  want{psi: psi{cpu10: 1.5, cpu60: 2.25, io10: 6, io: 5.5}, steal: 25, err: filepath.Join("pressure", "memory") + `: line 1 "some avg10=oops"`},
		},
		{
			name:  "io without its full line",
			files: with(map[string]string{"pressure/io": "some avg10=6.00 avg60=0.00 avg300=0.00 total=7\n"}),
			want:  want{psi: psi{cpu10: 1.5, cpu60: 2.25, mem10: 4, memFull: 3.5}, steal: 25, err: "io: no full line"},
		},
		{
			name:  "a pressure directory without its files",
			files: with(map[string]string{"pressure/cpu": "", "pressure/memory": "", "pressure/io": "", "pressure/.keep": "x"}),
			want:  want{psi: psi{}, steal: 25, err: "no such file"},
		},
		{
			name:  "no /proc/stat",
			files: with(map[string]string{"stat": ""}),
			want:  want{psi: psi{available: true, cpu10: 1.5, cpu60: 2.25, mem10: 4, memFull: 3.5, io10: 6, io: 5.5}, err: "stat"},
		},
		{
			name:  "a malformed /proc/stat",
			files: with(map[string]string{"stat": "cpu 1 2 3\n"}),
			want:  want{psi: psi{available: true, cpu10: 1.5, cpu60: 2.25, mem10: 4, memFull: 3.5, io10: 6, io: 5.5}, err: "3 values, want at least 8"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := procTree(t, tt.files)
			s := New(root)
			at := time.UnixMilli(1_700_000_000_123)
			p, err := s.Read(at)
			if p == nil {
				t.Fatal("Read returned nil")
			}
			if tt.want.err == "" && err != nil {
				t.Fatalf("Read: %v", err)
			}
			if tt.want.err != "" && (err == nil || !strings.Contains(err.Error(), tt.want.err)) {
				t.Fatalf("Read error %v, want one with %q", err, tt.want.err)
			}
			if p.GetCpuStealPercent() != 0 {
				t.Errorf("first sample's steal = %v, want 0", p.GetCpuStealPercent())
			}
			if p.GetAtUnixMs() != at.UnixMilli() {
				t.Errorf("at_unix_ms %d, want %d", p.GetAtUnixMs(), at.UnixMilli())
			}
			got := psi{p.GetAvailable(), p.GetCpuSomeAvg10(), p.GetCpuSomeAvg60(), p.GetMemorySomeAvg10(), p.GetMemoryFullAvg10(),
				p.GetIoSomeAvg10(), p.GetIoFullAvg10()}
			if got != tt.want.psi {
				t.Errorf("first sample %+v, want %+v", got, tt.want.psi)
			}

			if _, ok := tt.files["stat"]; ok && !strings.Contains(tt.want.err, "values") {
				if err := os.WriteFile(filepath.Join(root, "stat"), []byte(stat2), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			p2 := s.Sample(at.Add(30 * time.Second))
			if math.Abs(p2.GetCpuStealPercent()-tt.want.steal) > 1e-9 {
				t.Errorf("second sample's steal = %v, want %v", p2.GetCpuStealPercent(), tt.want.steal)
			}
		})
	}
}

// TestSamplerStealAcrossReadings: each sample's steal covers the time since
// the one before, and a reading that failed leaves the last good one in
// place.
func TestSamplerStealAcrossReadings(t *testing.T) {
	root := procTree(t, map[string]string{"stat": "cpu 100 0 0 0 0 0 0 0\n"})
	s := New(root)
	steps := []struct {
		stat string
		want float64
	}{
		{"cpu 100 0 0 0 0 0 0 0\n", 0},   // the first sample
		{"cpu 190 0 0 0 0 0 0 10\n", 10}, // 100 ticks, 10 stolen
		{"cpu garbage\n", 0},             // refused: the reading before stays the base
		{"cpu 290 0 0 0 0 0 0 110\n", 50},
		{"cpu 290 0 0 0 0 0 0 110\n", 0}, // no time passed
		{"cpu 5 0 0 0 0 0 0 1\n", 0},     // counters went back
		{"cpu 15 0 0 0 0 0 0 1\n", 0},
	}
	for i, st := range steps {
		if err := os.WriteFile(filepath.Join(root, "stat"), []byte(st.stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := s.Sample(time.Now()).GetCpuStealPercent(); math.Abs(got-st.want) > 1e-9 {
			t.Errorf("step %d (%q): steal %v, want %v", i, st.stat, got, st.want)
		}
	}
}

// TestSamplerRealProc samples this machine's /proc twice.
func TestSamplerRealProc(t *testing.T) {
	if runtime.GOOS != "linux" {
		testenv.NotApplicable(t, "/proc/stat and /proc/pressure are Linux's")
	}
	_, statErr := os.Stat("/proc/pressure/cpu")
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		t.Fatalf("stat /proc/pressure/cpu: %v", statErr)
	}
	hasPSI := statErr == nil
	s := New("/proc")
	for i := range 2 {
		p, err := s.Read(time.Now())
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if p.GetAvailable() != hasPSI {
			t.Errorf("sample %d: available %v, but /proc/pressure/cpu exists: %v", i, p.GetAvailable(), hasPSI)
		}
		if st := p.GetCpuStealPercent(); math.IsNaN(st) || st < 0 || st > 100 || (i == 0 && st != 0) {
			t.Errorf("sample %d: steal %v", i, st)
		}
		for name, v := range map[string]float64{"cpu some": p.GetCpuSomeAvg10(), "cpu some 60": p.GetCpuSomeAvg60(),
			"memory some": p.GetMemorySomeAvg10(), "memory full": p.GetMemoryFullAvg10(), "io some": p.GetIoSomeAvg10(), "io full": p.GetIoFullAvg10()} {
			if v < 0 || v > 100 || (!hasPSI && v != 0) {
				t.Errorf("sample %d: %s avg10 %v", i, name, v)
			}
		}
		t.Logf("sample %d: %v", i, p)
		time.Sleep(50 * time.Millisecond) // let the CPU counters move on; any value is valid
	}
}
