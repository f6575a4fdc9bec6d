package wire

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseCPUList(t *testing.T) {
	tests := []struct {
		in   string
		want []int
	}{
		{"0", []int{0}},
		{"0-3", []int{0, 1, 2, 3}},
		{"0-1,4,6-7", []int{0, 1, 4, 6, 7}},
		{"8191", []int{8191}},
		{"3,5", []int{3, 5}},
		{"0-55,112-167", nil},
	}
	for _, tt := range tests {
		got, err := ParseCPUList(tt.in)
		if tt.want == nil {
			tt.want = append(seq(0, 55), seq(112, 167)...)
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{
		"", ",", "0,", ",0", "0,,1", " 0", "0 ", "0-", "-1", "1-1", "3-1", "01", "00", "+1", "0x1", "1.0",
		"8192", "99999", "0-8192", "0-7:2", "1,0", "0-3,3", "0-3,2-5", "4,4", "1,2", "0-3,4", "0,1-2", "a", "0\n", "٣",
		strings.Repeat("1,", 600) + "1",
	} {
		if got, err := ParseCPUList(bad); err == nil || !errors.Is(err, ErrCPUList) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want a refusal wrapping ErrCPUList", bad, got, err)
		}
	}
}

func TestSliceID(t *testing.T) {
	for name, want := range map[string]string{
		"bcd-alloc-a.slice":                "a",
		"bcd-alloc-alloc_01K5W.slice":      "alloc_01K5W",
		"bcd-alloc-a-b.slice":              "a-b",
		SliceName(strings.Repeat("z", 64)): strings.Repeat("z", 64),
	} {
		if got, err := SliceID(name); err != nil || got != want {
			t.Errorf("SliceID(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "bcd-alloc-.slice", "bcd-alloc-a.service", "bcd-alloc-a.slice.d", "x-bcd-alloc-a.slice", "bcd-alloc-a/b.slice",
		"bcd-alloc-a.b.slice", "bcd-alloc--a.slice", "bcd-alloc-a-.slice", "bcd-alloc-a--b.slice", "bcd-alloc-a b.slice",
		"bcd-alloc-\x00.slice", SliceName(strings.Repeat("z", 65)), "BCD-ALLOC-a.slice",
	} {
		if got, err := SliceID(bad); err == nil {
			t.Errorf("SliceID(%q) = %q, want a refusal", bad, got)
		}
	}
}

// FuzzCPUList: the parser never panics, what it accepts is ascending and
// within bounds, and FormatCPUList prints it back as the input (one
// spelling per set).
func FuzzCPUList(f *testing.F) {
	for _, s := range []string{"0", "0-3,8", "1,3-5,7", "0-8191", "01", "1-0", "0,0", "0-7:2", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseCPUList(s)
		if err != nil {
			return
		}
		if len(got) == 0 || len(s) > MaxCPUList {
			t.Fatalf("accepted %q as %v", s, got)
		}
		for i, n := range got {
			if n < 0 || n > MaxCPU || i > 0 && n <= got[i-1] {
				t.Fatalf("%q gave %v", s, got)
			}
		}
		if back := FormatCPUList(got); back != s {
			t.Fatalf("%q parsed to %v, which prints as %q", s, got, back)
		}
	})
}

func seq(a, b int) []int {
	var out []int
	for n := a; n <= b; n++ {
		out = append(out, n)
	}
	return out
}

func TestFormatCPUList(t *testing.T) {
	for _, tt := range []struct {
		in   []int
		want string
	}{{[]int{0}, "0"}, {[]int{0, 1}, "0-1"}, {[]int{0, 1, 2, 5, 7, 8}, "0-2,5,7-8"}, {nil, ""}} {
		if got := FormatCPUList(tt.in); got != tt.want {
			t.Errorf("FormatCPUList(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
