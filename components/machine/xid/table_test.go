package xid

import (
	"strings"
	"testing"
)

// TestTable: every Xid in the table says what it means and what to do,
// and one bcd does not know is still described, as a warning.
func TestTable(t *testing.T) {
	for code := range table {
		i, known := Lookup(code)
		if !known || i.Code != code || i.Meaning == "" || i.Action == "" || (i.Severity != Warn && i.Severity != Fail) {
			t.Errorf("Xid %d: %+v known %v", code, i, known)
		}
	}
	for _, code := range []int{48, 63, 74, 79, 94, 95, 119, 140} {
		if _, known := Lookup(code); !known {
			t.Errorf("Xid %d is missing from the table", code)
		}
	}
	if i, _ := Lookup(79); i.Severity != Fail || !strings.Contains(i.Describe(), "Xid 79: the GPU has fallen off the bus; action: check") {
		t.Errorf("79: %s", i.Describe())
	}
	if i, _ := Lookup(13); i.Severity != Warn || i.Action != ActionRestartApp {
		t.Errorf("13: %+v", i)
	}
	i, known := Lookup(4242)
	if known || i.Severity != Warn || !strings.Contains(i.Describe(), "Xid 4242 is not in bcd's table") {
		t.Errorf("unknown: %+v %v", i, known)
	}
}
