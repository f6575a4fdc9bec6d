package deploy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

const MiB = 1 << 20

// osImage is a deterministic stand-in for a disk image: a boot sector,
// runs of zeros, text-like and random data, so it compresses about as
// well as an OS image.
func osImage(size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	words := []string{"kernel ", "module ", "/usr/lib/", "libc.so.6 ", "systemd ", "0000 ", "GLIBC_2.34 ", "\x00\x00\x00\x00", "ELF"}
	for off := 0; off < size; off += 64 << 10 {
		chunk := b[off:min(off+64<<10, size)]
		switch r.IntN(5) {
		case 0, 1: // zeros
		case 2, 3:
			for i := 0; i < len(chunk); {
				i += copy(chunk[i:], words[r.IntN(len(words))])
			}
		case 4:
			for i := range chunk {
				chunk[i] = byte(r.Uint32())
			}
		}
	}
	copy(b[446:], []byte{0x80, 0, 0, 0, 0xee})
	b[510], b[511] = 0x55, 0xaa
	copy(b[512:], "EFI PART")
	return b
}

func compress(t testing.TB, img []byte, c Compression) []byte {
	t.Helper()
	var buf bytes.Buffer
	switch c {
	case Gzip:
		w := gzip.NewWriter(&buf)
		w.Write(img)
		w.Close()
	case Zstd:
		w, _ := zstd.NewWriter(&buf)
		w.Write(img)
		w.Close()
	default:
		buf.Write(img)
	}
	return buf.Bytes()
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func isZero(b []byte) bool { return !bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) }

func TestWriteFile(t *testing.T) {
	img := osImage(8 * MiB)
	for _, c := range []Compression{None, Gzip, Zstd} {
		for _, ask := range []Compression{Auto, c} {
			t.Run(string(c)+"/asked "+string(ask), func(t *testing.T) {
				src := compress(t, img, c)
				dst := filepath.Join(t.TempDir(), "disk.img")
				var reports []Progress
				w := &Writer{ProgressEvery: MiB, BufferSize: 256 << 10}
				res, err := w.Write(context.Background(), bytes.NewReader(src), sum(src), ask, dst, func(p Progress) { reports = append(reports, p) })
				if err != nil {
					t.Fatal(err)
				}
				got, _ := os.ReadFile(dst)
				if !bytes.Equal(got, img) {
					t.Fatalf("the target holds %d bytes that differ from the %d-byte image", len(got), len(img))
				}
				if res.Compression != c || res.Read != int64(len(src)) || res.Written != int64(len(img)) || res.SHA256 != sum(src) {
					t.Errorf("result %+v", res)
				}
				if len(reports) < 8 || !reports[len(reports)-1].Done || reports[len(reports)-1].Written != int64(len(img)) {
					t.Errorf("%d progress reports, last %+v", len(reports), reports[len(reports)-1])
				}
				for i := 1; i < len(reports); i++ {
					if reports[i].Written < reports[i-1].Written {
						t.Errorf("progress went back: %+v then %+v", reports[i-1], reports[i])
					}
				}
				if c != None {
					t.Logf("%s: %d bytes -> %d (%.1fx)", c, len(src), len(img), float64(len(img))/float64(len(src)))
				}
			})
		}
	}
}

// TestWrongDigest: the whole image is written before its digest is known;
// a mismatch zeroes the first MiB and the last MiB written, and fails.
func TestWrongDigest(t *testing.T) {
	img := osImage(8 * MiB)
	src := compress(t, img, Zstd)
	dst := filepath.Join(t.TempDir(), "disk.img")
	wrong := sum([]byte("another image"))
	_, err := Write(context.Background(), bytes.NewReader(src), wrong, Auto, dst, nil)
	if err == nil {
		t.Fatal("a wrong digest was accepted")
	}
	for _, want := range []string{"the image's sha256 is " + sum(src) + ", want " + wrong, "zeroed the first MiB and the last MiB written", "the target is left unbootable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	got, _ := os.ReadFile(dst)
	if len(got) != len(img) {
		t.Fatalf("target is %d bytes", len(got))
	}
	if !isZero(got[:MiB]) || !isZero(got[len(got)-MiB:]) {
		t.Error("the first or last MiB is not zero")
	}
	if !bytes.Equal(got[MiB:len(got)-MiB], img[MiB:len(img)-MiB]) {
		t.Error("the middle of the image is not what was written")
	}
}

func TestRefusedBeforeWriting(t *testing.T) {
	img := osImage(MiB)
	gz := compress(t, img, Gzip)
	for _, tc := range []struct {
		name   string
		src    []byte
		digest string
		c      Compression
		want   string
	}{
		{"bad digest", gz, "abc", Auto, `digest "abc" is not 64 lowercase hex digits`},
		{"upper-case digest", gz, strings.ToUpper(sum(gz)), Auto, "is not 64 lowercase hex digits"},
		{"zstd asked, gzip given", gz, sum(gz), Zstd, "zstd was asked for, but the image starts like gzip"},
		{"gzip asked, raw given", img, sum(img), Gzip, "gzip was asked for, but the image starts like none"},
		{"xz", []byte("\xfd7zXZ\x00rest"), sum([]byte("\xfd7zXZ\x00rest")), Auto, "the image is xz-compressed"},
		{"bzip2", []byte("BZh91AY"), sum([]byte("BZh91AY")), Auto, "the image is bzip2-compressed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "disk.img")
			_, err := Write(context.Background(), bytes.NewReader(tc.src), tc.digest, tc.c, dst, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Write = %v, want %q", err, tc.want)
			}
			if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the target was created: %v", err)
			}
		})
	}
}

func TestFailuresLeaveItUnbootable(t *testing.T) {
	img := osImage(8 * MiB)
	zs := compress(t, img, Zstd)
	gz := compress(t, img, Gzip)
	for _, tc := range []struct {
		name string
		src  []byte
		want string
	}{
		{"truncated zstd", zs[:len(zs)/2], "zstd: "},
		{"truncated gzip", gz[:len(gz)/2], "gzip: unexpected EOF"},
		{"garbage after gzip", append(append([]byte{}, gz...), "trailing"...), "gzip: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "disk.img")
			w := &Writer{BufferSize: 64 << 10} // so writing began before the failure
			_, err := w.Write(context.Background(), bytes.NewReader(tc.src), sum(tc.src), Auto, dst, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "left unbootable") {
				t.Fatalf("Write = %v, want %q and left unbootable", err, tc.want)
			}
			got, _ := os.ReadFile(dst)
			if len(got) > 0 && !isZero(got[:min(MiB, len(got))]) {
				t.Error("the first MiB is not zero")
			}
		})
	}
}

func TestNothingWritten(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "disk.img")
	src := []byte("\x28\xb5\x2f\xfdnot really zstd")
	_, err := Write(context.Background(), bytes.NewReader(src), sum(src), Auto, dst, nil)
	if err == nil || !strings.Contains(err.Error(), "zstd: ") || !strings.Contains(err.Error(), "nothing was written to it") {
		t.Fatalf("Write = %v", err)
	}
}

func TestCancel(t *testing.T) {
	img := osImage(16 * MiB)
	src := compress(t, img, Zstd)
	dst := filepath.Join(t.TempDir(), "disk.img")
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer{ProgressEvery: 4 * MiB, BufferSize: MiB}
	_, err := w.Write(ctx, bytes.NewReader(src), sum(src), Auto, dst, func(p Progress) {
		if p.Written >= 4*MiB {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "left unbootable") {
		t.Fatalf("Write = %v", err)
	}
	got, _ := os.ReadFile(dst)
	if len(got) == 0 || len(got) >= len(img) || !isZero(got[:MiB]) {
		t.Errorf("target %d bytes, first MiB zero %v", len(got), len(got) > 0 && isZero(got[:MiB]))
	}
}

func TestSniff(t *testing.T) {
	for head, want := range map[string]Compression{
		"\x1f\x8b\x08\x00": Gzip, "\x28\xb5\x2f\xfd\x04": Zstd, "\x00\x00\x00\x00": None, "": None, "\x1f": None,
	} {
		if got, err := Sniff([]byte(head)); err != nil || got != want {
			t.Errorf("Sniff(%q) = %q, %v, want %q", head, got, err, want)
		}
	}
	for in, want := range map[string]Compression{"": Auto, "auto": Auto, "none": None, "gzip": Gzip, "zstd": Zstd} {
		if got, err := ParseCompression(in); err != nil || got != want {
			t.Errorf("ParseCompression(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseCompression("lz4"); err == nil {
		t.Error("lz4 accepted")
	}
}

// TestDirectIO: on a file system that takes O_DIRECT the target is opened
// with it, and an image whose length is not a whole number of blocks
// still lands whole (the tail is written after O_DIRECT is turned off),
// for odd buffer sizes too; on tmpfs, which refuses O_DIRECT, the write
// falls back to the page cache.
func TestDirectIO(t *testing.T) {
	img := osImage(3*MiB + 1234)
	src := compress(t, img, Zstd)
	dir := t.TempDir()
	probe := filepath.Join(dir, "probe")
	f, direct, err := openDirect(probe, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !direct {
		t.Logf("%s does not take O_DIRECT: the page-cache path is what this tests", dir)
	}
	dirs := []string{dir}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dirs = append(dirs, "/dev/shm")
	}
	for _, d := range dirs {
		for _, buf := range []int{0, 100 << 10, 4096 + 1} {
			dst, err := os.CreateTemp(d, "deploy-direct-*.img")
			if err != nil {
				t.Fatal(err)
			}
			dst.Close()
			defer os.Remove(dst.Name())
			w := &Writer{BufferSize: buf}
			if _, err := w.Write(context.Background(), bytes.NewReader(src), sum(src), Zstd, dst.Name(), nil); err != nil {
				t.Fatalf("%s, buffer %d: %v", d, buf, err)
			}
			got, _ := os.ReadFile(dst.Name())
			if !bytes.Equal(got, img) {
				t.Fatalf("%s, buffer %d: the target holds %d bytes that differ from the %d-byte image", d, buf, len(got), len(img))
			}
		}
	}
}
