package pressure

import (
	"math"
	"strings"
	"testing"
)

func TestParsePSI(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    PSI
		wantErr string // a substring of the error; "" for none
	}{
		{
			name: "memory: some and full",
			in:   "some avg10=0.12 avg60=0.05 avg300=0.01 total=12345\nfull avg10=0.10 avg60=0.04 avg300=0.00 total=678\n",
			want: PSI{Some: Averages{0.12, 0.05, 0.01, 12345}, Full: Averages{0.10, 0.04, 0, 678}, HasFull: true},
		},
		{
			name: "cpu before 5.13: some only",
			in:   "some avg10=11.50 avg60=5.73 avg300=15.01 total=264589555\n",
			want: PSI{Some: Averages{11.5, 5.73, 15.01, 264589555}},
		},
		{
			name: "no trailing newline, blank lines, extra spaces",
			in:   "\n  some  avg10=100.00 avg60=0 avg300=0.00 total=0  \n\n",
			want: PSI{Some: Averages{Avg10: 100}},
		},
		{
			name: "an unknown field is ignored",
			in:   "some avg10=1.00 avg60=2.00 avg300=3.00 total=4 avg900=5.00\n",
			want: PSI{Some: Averages{1, 2, 3, 4}},
		},
		{name: "empty", in: "", wantErr: "no some line"},
		{name: "full only", in: "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", wantErr: "no some line"},
		{name: "unknown kind", in: "most avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", wantErr: "line 1 \"most avg10"},
		{name: "two some lines", in: "some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0\n", wantErr: "line 2 \"some avg10=0 avg60=0 avg300=0 total=0\": a second some line"},
		{name: "two full lines", in: "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0", wantErr: "a second full line"},
		{name: "missing total", in: "some avg10=0.00 avg60=0.00 avg300=0.00\n", wantErr: "no total"},
		{name: "missing avg60", in: "some avg10=0.00 avg300=0.00 total=1\n", wantErr: "no avg60"},
		{name: "duplicate key", in: "some avg10=0.00 avg10=0.00 avg60=0 avg300=0 total=1\n", wantErr: "avg10 appears twice"},
		{name: "not key=value", in: "some avg10 avg60=0 avg300=0 total=1\n", wantErr: `field "avg10" is not key=value`},
		{name: "empty value", in: "some avg10= avg60=0 avg300=0 total=1\n", wantErr: "not key=value"},
		{name: "negative average", in: "some avg10=-1.00 avg60=0 avg300=0 total=1\n", wantErr: `avg10="-1.00" is not a percentage`},
		{name: "average above 100", in: "some avg10=100.01 avg60=0 avg300=0 total=1\n", wantErr: "is not a percentage"},
		{name: "NaN", in: "some avg10=NaN avg60=0 avg300=0 total=1\n", wantErr: "is not a percentage"},
		{name: "exponent", in: "some avg10=1e1 avg60=0 avg300=0 total=1\n", wantErr: "is not a percentage"},
		{name: "hex float", in: "some avg10=0x1p-2 avg60=0 avg300=0 total=1\n", wantErr: "is not a percentage"},
		{name: "negative total", in: "some avg10=0 avg60=0 avg300=0 total=-1\n", wantErr: `total="-1" is not an unsigned integer`},
		{name: "total overflows", in: "some avg10=0 avg60=0 avg300=0 total=18446744073709551616\n", wantErr: "not an unsigned integer"},
		{name: "total with a sign", in: "some avg10=0 avg60=0 avg300=0 total=+1\n", wantErr: "not an unsigned integer"},
		{name: "bad full line", in: "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0\n", wantErr: "line 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePSI([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParsePSI(%q) = %+v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParsePSI(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	const real = "cpu  84698 0 27655 89578 2592 0 458 369 0 0\ncpu0 42000 0 13000 44000 1200 0 200 180 0 0\nintr 1 2 3\n"
	tests := []struct {
		name    string
		in      string
		want    CPUTimes
		wantErr string
	}{
		{name: "a real /proc/stat", in: real, want: CPUTimes{Total: 84698 + 27655 + 89578 + 2592 + 458 + 369, Steal: 369, Idle: 89578 + 2592}},
		{name: "guest time is not added again", in: "cpu 10 0 0 10 0 0 0 5 7 9\n", want: CPUTimes{Total: 25, Steal: 5, Idle: 10}},
		{name: "exactly eight values", in: "cpu 1 2 3 4 5 6 7 8\n", want: CPUTimes{Total: 36, Steal: 8, Idle: 9}},
		{name: "the cpu line after others", in: "btime 1\ncpu 1 1 1 1 1 1 1 1 0 0\n", want: CPUTimes{Total: 8, Steal: 1, Idle: 2}},
		{name: "only per-CPU lines", in: "cpu0 1 1 1 1 1 1 1 1\n", wantErr: `no "cpu" line`},
		{name: "empty", in: "", wantErr: `no "cpu" line`},
		{name: "seven values", in: "cpu 1 2 3 4 5 6 7\n", wantErr: "line 1 \"cpu 1 2 3 4 5 6 7\": 7 values, want at least 8"},
		{name: "a word", in: "cpu 1 2 3 x 5 6 7 8\n", wantErr: `value 4 ("x") is not an unsigned integer`},
		{name: "a negative value", in: "cpu 1 2 3 4 5 6 7 -8\n", wantErr: "value 8"},
		{name: "a bad guest value", in: "cpu 1 2 3 4 5 6 7 8 9.5\n", wantErr: "value 9"},
		{name: "overflow", in: "cpu 18446744073709551615 1 0 0 0 0 0 0\n", wantErr: "overflow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseStat(%q) = %+v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseStat(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestStealPercent(t *testing.T) {
	tests := []struct {
		name      string
		prev, cur CPUTimes
		want      float64
	}{
		{"a quarter stolen", CPUTimes{Total: 1000, Steal: 10}, CPUTimes{Total: 1400, Steal: 110}, 25},
		{"none stolen", CPUTimes{Total: 1000, Steal: 10}, CPUTimes{Total: 2000, Steal: 10}, 0},
		{"all stolen", CPUTimes{Total: 0, Steal: 0}, CPUTimes{Total: 50, Steal: 50}, 100},
		{"no time passed", CPUTimes{Total: 1000, Steal: 10}, CPUTimes{Total: 1000, Steal: 10}, 0},
		{"counters went back (a reboot)", CPUTimes{Total: 1000, Steal: 10}, CPUTimes{Total: 100, Steal: 1}, 0},
		{"steal went back", CPUTimes{Total: 1000, Steal: 10}, CPUTimes{Total: 2000, Steal: 5}, 0},
	}
	for _, tt := range tests {
		if got := StealPercent(tt.prev, tt.cur); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: StealPercent = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func FuzzParsePSI(f *testing.F) {
	for _, s := range []string{
		"some avg10=0.12 avg60=0.05 avg300=0.01 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
		"some avg10=100.00 avg60=0 avg300=0 total=18446744073709551615",
		"some avg10=1e1 avg60=NaN avg300=Inf total=-1",
		"some avg10=0 avg10=0",
		"full\nsome\n",
		"some a=b=c ==\xff\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePSI(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		for _, a := range []Averages{p.Some, p.Full} {
			for _, x := range []float64{a.Avg10, a.Avg60, a.Avg300} {
				if math.IsNaN(x) || x < 0 || x > 100 {
					t.Fatalf("ParsePSI(%q) accepted an average %v", b, x)
				}
			}
		}
	})
}

func FuzzParseStat(f *testing.F) {
	for _, s := range []string{
		"cpu  84698 0 27655 89578 2592 0 458 369 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n",
		"cpu 1 2 3 4 5 6 7\n",
		"cpu 18446744073709551615 1 0 0 0 0 0 0",
		"cpu -1 +2 0x3 4 5 6 7 8",
		"\x00cpu\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseStat(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if c.Steal > c.Total {
			t.Fatalf("ParseStat(%q) = %+v: steal above the total", b, c)
		}
		if p := StealPercent(CPUTimes{}, c); math.IsNaN(p) || p < 0 || p > 100 {
			t.Fatalf("StealPercent of %+v = %v", c, p)
		}
		if c.Idle > c.Total {
			t.Fatalf("ParseStat(%q) = %+v: idle above the total", b, c)
		}
		if p := BusyShare(CPUTimes{}, c); math.IsNaN(p) || p < 0 || p > 1 {
			t.Fatalf("BusyShare of %+v = %v", c, p)
		}
	})
}

func TestBusyShare(t *testing.T) {
	tests := []struct {
		name      string
		prev, cur CPUTimes
		want      float64
	}{
		{"a quarter busy", CPUTimes{Total: 100, Idle: 50}, CPUTimes{Total: 200, Idle: 125}, 0.25},
		{"stolen time is not work", CPUTimes{Total: 0}, CPUTimes{Total: 100, Idle: 50, Steal: 50}, 0},
		{"all busy", CPUTimes{Total: 10, Idle: 5}, CPUTimes{Total: 20, Idle: 5}, 1},
		{"no time passed", CPUTimes{Total: 10}, CPUTimes{Total: 10}, 0},
		{"counters went backwards", CPUTimes{Total: 10, Idle: 9}, CPUTimes{Total: 20, Idle: 1}, 0},
	}
	for _, tt := range tests {
		if got := BusyShare(tt.prev, tt.cur); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: BusyShare = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Meminfo
		wantErr string
	}{
		{name: "a real meminfo", in: "MemTotal:       16303948 kB\nMemFree:         1021860 kB\nMemAvailable:   10262804 kB\n",
			want: Meminfo{Total: 16303948 * 1024, Available: 10262804 * 1024}},
		{name: "no MemAvailable (before 3.14)", in: "MemTotal: 1 kB\nMemFree: 1 kB\n", wantErr: "no MemTotal and MemAvailable"},
		{name: "not kB", in: "MemTotal: 1 MB\nMemAvailable: 1 kB\n", wantErr: "want <name>: <number> kB"},
		{name: "a word", in: "MemTotal: x kB\nMemAvailable: 1 kB\n", wantErr: "want <name>: <number> kB"},
		{name: "overflow", in: "MemTotal: 18446744073709551615 kB\nMemAvailable: 1 kB\n", wantErr: "overflows"},
		{name: "empty", in: "", wantErr: "no MemTotal"},
	}
	for _, tt := range tests {
		got, err := ParseMeminfo([]byte(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: ParseMeminfo = %+v, %v; want an error with %q", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: ParseMeminfo = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func FuzzParseMeminfo(f *testing.F) {
	for _, s := range []string{"MemTotal: 16303948 kB\nMemAvailable: 10262804 kB\n", "MemTotal: 1 kB", "MemTotal:\x00 kB\nMemAvailable: -1 kB"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMeminfo(b)
		if err == nil && m.Total == 0 {
			t.Fatalf("ParseMeminfo(%q) = %+v without a total", b, m)
		}
	})
}
