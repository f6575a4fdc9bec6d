package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/journal/wal/powercut"
)

func recs(n int) [][]byte {
	var out [][]byte
	for i := 0; i < n; i++ {
		out = append(out, []byte(fmt.Sprintf(`{"record":%d,"pad":"%s"}`, i, bytes.Repeat([]byte("x"), i*7))))
	}
	return out
}

func TestAppendSyncParse(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	l, err := Create(p, 7, Segment)
	if err != nil {
		t.Fatal(err)
	}
	want := recs(50)
	for i := 0; i < len(want); i += 10 {
		if err := l.Append(want[i : i+10]); err != nil {
			t.Fatal(err)
		}
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if l.Synced() != l.Size() {
		t.Fatalf("synced %d of %d", l.Synced(), l.Size())
	}
	l.Close()
	st, _ := os.Stat(p)
	if st.Size() < l.Size() || st.Size() > 2*l.Size() || st.Size()%FirstSegment != 0 {
		t.Errorf("file is %d bytes for %d written, want whole segments, at most twice as many", st.Size(), l.Size())
	}
	c, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Gen != 7 || c.End != l.Size() || c.Torn != 0 || len(c.Records) != len(want) {
		t.Fatalf("parsed gen %d end %d (want %d) torn %d, %d records", c.Gen, c.End, l.Size(), c.Torn, len(c.Records))
	}
	for i := range want {
		if !bytes.Equal(c.Records[i], want[i]) {
			t.Fatalf("record %d: %q", i, c.Records[i])
		}
	}
}

// TestGrowsBySegments: a log grows by whole segments, never to the byte:
// doubling from the first segment, then a segment at a time.
func TestGrowsBySegments(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	l, err := Create(p, 1, Segment)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	syncs := l.Syncs()
	rec := bytes.Repeat([]byte{'a'}, 1000)
	var sizes []int64
	for l.Size() < 3*Segment {
		if err := l.Append([][]byte{rec}); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(p)
		if n := len(sizes); n == 0 || sizes[n-1] != st.Size() {
			sizes = append(sizes, st.Size())
		}
	}
	want := []int64{16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 3 << 20, 4 << 20}
	if fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Fatalf("file sizes %v, want %v", sizes, want)
	}
	if got := l.Syncs() - syncs; got != uint64(len(want)-1) {
		t.Fatalf("%d fdatasyncs to grow %d times", got, len(want)-1)
	}
}

// TestTornTailIsCut: a log cut at any byte, or with any byte of its last
// frame changed, reads as the frames before the damage, never as more.
func TestTornTailIsCut(t *testing.T) {
	var b []byte
	b = AppendHeader(b, 3)
	want := recs(4)
	var ends []int
	for _, r := range want {
		b = AppendFrame(b, 3, r)
		ends = append(ends, len(b))
	}
	whole := func(n int) int { // frames wholly inside the first n bytes
		k := 0
		for k < len(ends) && ends[k] <= n {
			k++
		}
		return k
	}
	for cut := HeaderSize; cut <= len(b); cut++ {
		c, err := Parse(b[:cut])
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Records) != whole(cut) {
			t.Fatalf("cut at %d: %d records, want %d", cut, len(c.Records), whole(cut))
		}
	}
	last := ends[len(ends)-2]
	for i := last; i < len(b); i++ {
		d := bytes.Clone(b)
		d[i] ^= 0x40
		c, _ := Parse(d)
		if len(c.Records) != len(want)-1 || c.End != int64(last) || c.Torn == 0 {
			t.Fatalf("byte %d changed: %d records, end %d torn %d", i, len(c.Records), c.End, c.Torn)
		}
	}
	// A frame from a log of another generation does not pass.
	other := AppendFrame(AppendHeader(nil, 3), 4, want[0])
	if c, _ := Parse(other); len(c.Records) != 0 {
		t.Fatal("a frame of generation 4 read in a log of generation 3")
	}
	// Preallocated zeros are a clean end.
	c, _ := Parse(append(bytes.Clone(b), make([]byte, 4096)...))
	if len(c.Records) != len(want) || c.Torn != 0 {
		t.Fatalf("zeros after the log: %d records torn %d", len(c.Records), c.Torn)
	}
	if _, err := Parse([]byte("garbage garbage garbage")); !errors.Is(err, ErrHeader) {
		t.Fatalf("no header: %v", err)
	}
}

// TestFailedLogTakesNothing: after a failure the log refuses writes.
func TestFailedLogTakesNothing(t *testing.T) {
	l, err := Create(filepath.Join(t.TempDir(), "log"), 1, Segment)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	eio := errors.New("EIO")
	l.Fail(eio)
	if err := l.Append(recs(1)); !errors.Is(err, eio) {
		t.Fatalf("append after failure: %v", err)
	}
	if err := l.Sync(); !errors.Is(err, eio) {
		t.Fatalf("sync after failure: %v", err)
	}
}

// FuzzParse: any bytes parse without a panic, and what Parse returns is
// exactly the frames it read: framing them again gives back the bytes up
// to End.
func FuzzParse(f *testing.F) {
	b := AppendHeader(nil, 9)
	for _, r := range recs(3) {
		b = AppendFrame(b, 9, r)
	}
	f.Add(b)
	f.Add(b[:len(b)-3])
	f.Add(append(bytes.Clone(b), 1, 2, 3))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			return
		}
		again := AppendHeader(nil, c.Gen)
		for _, r := range c.Records {
			again = AppendFrame(again, c.Gen, r)
		}
		if !bytes.Equal(again, b[:c.End]) {
			t.Fatalf("re-framed records differ from the bytes parsed")
		}
		if c.End+c.Torn > int64(len(b)) {
			t.Fatalf("end %d + torn %d past %d bytes", c.End, c.Torn, len(b))
		}
	})
}

// TestSyncedSurvivesPowerCut writes groups of records through a file that
// loses at a power cut whatever was not fdatasynced, syncing some groups,
// and cuts the power at a random point: every record of a group whose
// Sync returned is in the file read back, and Synced never counts a byte
// the disk does not hold. The proof rests on what reached the disk, not on
// the log's own count: a Sync that skipped its fdatasync fails it.
func TestSyncedSurvivesPowerCut(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for trial := 0; trial < 20; trial++ {
		path := filepath.Join(t.TempDir(), "log")
		f, err := powercut.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		l, err := CreateOn(f, path, 3, FirstSegment)
		if err != nil {
			t.Fatal(err)
		}
		synced, appended := 0, 0
		groups := 1 + rng.Intn(12)
		for g := 0; g < groups; g++ {
			var recs [][]byte
			for range 1 + rng.Intn(5) {
				recs = append(recs, []byte(fmt.Sprintf("record %d %s", appended+len(recs), strings.Repeat("x", rng.Intn(3000)))))
			}
			if err := l.Append(recs); err != nil {
				t.Fatal(err)
			}
			appended += len(recs)
			if rng.Intn(3) > 0 {
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
				synced = appended
			}
		}
		claimed := l.Synced()
		f.Cut()
		l.Close()
		c, err := ReadFile(path)
		if err != nil {
			t.Fatalf("trial %d: no result is acked before it is durable: after a power cut the log is unreadable (%v), yet %d records were synced", trial, err, synced)
		}
		if len(c.Records) < synced || c.End < claimed {
			t.Fatalf("trial %d: no result is acked before it is durable: after a power cut the disk holds %d records (%d bytes), but Sync returned for %d (Synced says %d bytes)",
				trial, len(c.Records), c.End, synced, claimed)
		}
		for i, r := range c.Records {
			if want := fmt.Sprintf("record %d ", i); !strings.HasPrefix(string(r), want) {
				t.Fatalf("trial %d: record %d is %.20q", trial, i, r)
			}
		}
	}
}
