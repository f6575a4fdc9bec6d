package resident

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// rssFile is the process's resident file-backed memory (KiB).
func rssFile(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "RssFile:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// TestDropGivesBackCode: after Drop the test binary's resident file pages
// shrink, and its code and read-only data still work (they come back from
// the page cache on their next touch): a GC, which reads the binary's
// tables for every stack, and a formatted string.
func TestDropGivesBackCode(t *testing.T) {
	before := rssFile(t)
	n, err := Drop()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if n == 0 || after >= before {
		t.Fatalf("Drop spanned %d bytes; resident file pages %d KiB before, %d KiB after", n, before, after)
	}
	runtime.GC()
	if s := strconv.Quote("still\there"); s != `"still\there"` {
		t.Fatalf("after Drop: %s", s)
	}
	t.Logf("Drop spanned %d KiB; resident file pages %d KiB before, %d KiB after", n>>10, before, after)
}
