package main

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzParseOutput: ipmitool's output carries what the BMC says; the
// parsers never panic and keep only bounded, printable UTF-8.
func FuzzParseOutput(f *testing.F) {
	f.Add("Device ID : 0\nProduct Name : x\n Boot Device Selector : Force PXE\n - Options apply to only next boot\nChassis Power is on\nT | 01h | ok | 3.1 | 96 degrees C\n")
	f.Add("System GUID : efcdab89-6745-23a1-efcd-ab89674523a1\n\x00\xff:\x01|||||\n")
	f.Fuzz(func(t *testing.T, out string) {
		check := func(s string, n int) {
			if len(s) > n || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
				t.Fatalf("kept %q", s)
			}
		}
		fs := parseFields(out)
		if len(fs) > maxFields {
			t.Fatal("too many fields")
		}
		for _, f := range fs {
			check(f.key, 64)
			check(f.value, 256)
		}
		ss := parseSDR(out)
		if len(ss) > maxSensors {
			t.Fatal("too many sensors")
		}
		for _, s := range ss {
			for _, v := range []string{s.Name, s.ID, s.Status, s.Entity, s.Reading} {
				check(v, 64)
			}
		}
		parseBootFlags(out)
		parsePower(out)
		if u, ok := parseUUID(strings.TrimSpace(out)); ok && len(u) != 36 {
			t.Fatal(u)
		}
	})
}
