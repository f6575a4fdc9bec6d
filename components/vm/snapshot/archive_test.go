package snapshot

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
)

// archiveBytes is a snapshot archive around a real empty qcow2.
func archiveBytes(t testing.TB, m Manifest) []byte {
	dir := t.TempDir()
	disk := filepath.Join(dir, "d.qcow2")
	if out, err := exec.Command(testenv.NeedTool(t, "qemu-img", "qemu-utils"), "create", "-q", "-f", "qcow2", disk, "1M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	p := filepath.Join(dir, "a.tar")
	if _, _, err := WriteArchive(p, m, disk, ""); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	return b
}

var goodManifest = Manifest{Version: 1, Instance: "vm-a", VCPUs: 1, MemoryMiB: 64, CPU: "x", Created: time.Unix(0, 0).UTC()}

// TestUnpack: a good archive unpacks with its manifest; a manifest with
// an unknown field, another version or a memory flag without a memory
// member, a member out of order and a truncated archive are refused,
// leaving nothing.
func TestUnpack(t *testing.T) {
	good := archiveBytes(t, goodManifest)
	mem := goodManifest
	mem.Memory = true
	for _, tt := range []struct {
		name, want string
		b          []byte
	}{
		{name: "good", b: good},
		{name: "memory flag without memory", b: archiveBytes(t, mem), want: "says memory true"},
		{name: "version 2", b: []byte(strings.Replace(string(good), `"version":1`, `"version":2`, 1)), want: "version 2"},
		{name: "truncated", b: good[:1000], want: "snapshot refused"},
		{name: "not a tar", b: []byte("hello"), want: "snapshot refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "a.tar")
			os.WriteFile(p, tt.b, 0o600)
			m, err := Unpack(p, filepath.Join(dir, "x.d"))
			if tt.want == "" {
				if err != nil || m.Instance != "vm-a" {
					t.Fatalf("Unpack = %+v, %v", m, err)
				}
				if got, err := ReadManifest(filepath.Join(dir, "x.d")); err != nil || got.Instance != "vm-a" {
					t.Errorf("ReadManifest = %+v, %v", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Unpack = %v, want %q", err, tt.want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 1 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// FuzzUnpack: whatever a snapshot server sends, Unpack never panics and
// leaves either a directory whose manifest reads back or nothing.
func FuzzUnpack(f *testing.F) {
	f.Add(archiveBytes(f, goodManifest))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "a.tar")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "x.d")
		if _, err := Unpack(p, out); err != nil {
			if _, serr := os.Lstat(out); serr == nil {
				t.Fatal("a refused archive left its directory")
			}
			return
		}
		if _, err := ReadManifest(out); err != nil {
			t.Fatalf("accepted, but its manifest does not read back: %v", err)
		}
	})
}
