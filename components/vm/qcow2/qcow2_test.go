package qcow2

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

// qemuImg runs qemu-img create in dir with args and returns the image.
func qemuImg(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	bin := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	p := filepath.Join(dir, name)
	// LUKS's key derivation times itself first, and on a loaded machine
	// qemu-img sometimes gives up ("Unable to get accurate CPU usage").
	for try := 1; ; try++ {
		cmd := exec.Command(bin, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), p)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil {
			return p
		}
		if try == 3 || !strings.Contains(string(out), "accurate CPU usage") {
			t.Fatalf("qemu-img create %v: %v\n%s", args, err, out)
		}
	}
}

// TestImagesQEMUMade checks the rules against images qemu-img made: each
// refusal is one an attacker's image would use.
func TestImagesQEMUMade(t *testing.T) {
	dir := t.TempDir()
	base := qemuImg(t, dir, "base.qcow2", "-o", "size=64M")
	raw := filepath.Join(dir, "plain.raw")
	if err := os.WriteFile(raw, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	asBase := Backing{}
	ofBase := Backing{Path: base, Format: "qcow2"}
	for _, tt := range []struct {
		name    string
		args    []string
		want    Backing
		wantErr string
	}{
		{name: "base", args: []string{"-o", "size=64M"}, want: asBase},
		{name: "base v2", args: []string{"-o", "compat=0.10", "-o", "size=64M"}, want: asBase},
		{name: "base extended L2 zstd", args: []string{"-o", "extended_l2=on,compression_type=zstd,cluster_size=128k", "-o", "size=64M"}, want: asBase},
		{name: "overlay of its base", args: []string{"-b", base, "-F", "qcow2"}, want: ofBase},
		{name: "overlay as a base", args: []string{"-b", base, "-F", "qcow2"}, want: asBase, wantErr: "a base image may name none"},
		{name: "overlay of another base", args: []string{"-u", "-b", filepath.Join(dir, "other.qcow2"), "-F", "qcow2", "-o", "size=64M"}, want: ofBase, wantErr: "not its recorded base"},
		{name: "overlay of its base as raw", args: []string{"-u", "-b", base, "-F", "raw", "-o", "size=64M"}, want: ofBase, wantErr: `backing format "raw"`},
		{name: "backing /etc/shadow", args: []string{"-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"}, want: asBase, wantErr: `"/etc/shadow"`},
		{name: "backing /etc/shadow as overlay", args: []string{"-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M"}, want: ofBase, wantErr: "not its recorded base"},
		{name: "data file", args: []string{"-o", "data_file=" + filepath.Join(dir, "data.raw"), "-o", "size=64M"}, want: asBase, wantErr: "external data file"},
		{name: "luks", args: []string{"--object", "secret,id=sec0,data=s3cr3t", "-o", "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=100", "-o", "size=64M"}, want: asBase, wantErr: "encrypted"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := qemuImg(t, dir, strings.NewReplacer(" ", "_", "/", "_").Replace(tt.name)+".qcow2", tt.args...)
			_, err := CheckFile(p, tt.want)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("CheckFile = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if _, err := CheckFile(raw, asBase); err == nil || !strings.Contains(err.Error(), "not a qcow2") {
		t.Errorf("a plain file: %v, want not a qcow2 image", err)
	}
	if _, err := CheckFile(dir, asBase); err == nil {
		t.Error("a directory passed")
	}
	link := filepath.Join(dir, "link.qcow2")
	if err := os.Symlink(base, link); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckFile(link, asBase); err == nil {
		t.Error("a symlink to a good base passed: CheckFile must not follow it")
	}
	h, err := CheckFile(base, asBase)
	if err != nil || h.VirtualSize != 64<<20 || h.Version != 3 {
		t.Errorf("base: %+v, %v; want version 3 of 64 MiB", h, err)
	}
}

// header is a minimal version 3 header with no extension but the end.
func header() []byte {
	b := make([]byte, 4096)
	be := binary.BigEndian
	be.PutUint32(b, Magic)
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], 16)
	be.PutUint64(b[24:], 1<<30)
	be.PutUint32(b[96:], 4)
	be.PutUint32(b[100:], 112)
	return b
}

// TestHeaderFields covers what qemu-img will not write any more (AES)
// and what a hand-made image could carry.
func TestHeaderFields(t *testing.T) {
	be := binary.BigEndian
	ext := func(typ uint32, data string) func([]byte) {
		return func(b []byte) {
			be.PutUint32(b[112:], typ)
			be.PutUint32(b[116:], uint32(len(data)))
			copy(b[120:], data)
		}
	}
	for _, tt := range []struct {
		name    string
		edit    func([]byte)
		wantErr string
	}{
		{"good", func([]byte) {}, ""},
		{"aes", func(b []byte) { be.PutUint32(b[32:], 1) }, "encrypted (method 1)"},
		{"luks method", func(b []byte) { be.PutUint32(b[32:], 2) }, "encrypted (method 2)"},
		{"encryption extension", ext(extFullDiskCrypt, "0123456789abcdef"), "encryption header"},
		{"data file extension only", ext(extDataFile, "/dev/sda"), "external data file"},
		{"data file bit only", func(b []byte) { be.PutUint64(b[72:], IncompatDataFile) }, "external data file"},
		{"corrupt", func(b []byte) { be.PutUint64(b[72:], IncompatCorrupt) }, "corrupt"},
		{"unknown incompatible", func(b []byte) { be.PutUint64(b[72:], 1<<20) }, "unknown incompatible"},
		{"dirty", func(b []byte) { be.PutUint64(b[72:], IncompatDirty) }, ""},
		{"version 4", func(b []byte) { be.PutUint32(b[4:], 4) }, "version 4"},
		{"header past read", func(b []byte) { be.PutUint32(b[100:], 1<<20) }, "does not fit"},
		{"extension past read", ext(extBackingFormat, strings.Repeat("x", 8000)), "runs past"},
		{"no end marker", func(b []byte) {
			for off := 112; off+8 <= len(b); off += 8 {
				be.PutUint32(b[off:], 0x12345678)
			}
		}, "run past"},
		{"backing name past read", func(b []byte) { be.PutUint64(b[8:], 4090); be.PutUint32(b[16:], 100) }, "past the first"},
		{"backing name too long", func(b []byte) { be.PutUint64(b[8:], 200); be.PutUint32(b[16:], 2000) }, "1 to 1023"},
		{"backing name", func(b []byte) { be.PutUint64(b[8:], 512); be.PutUint32(b[16:], 11); copy(b[512:], "/etc/shadow") }, `"/etc/shadow"`},
		{"cluster bits", func(b []byte) { be.PutUint32(b[20:], 40) }, "cluster bits"},
		{"magic", func(b []byte) { b[0] = 'X' }, "not a qcow2"},
	} {
		b := header()
		tt.edit(b)
		_, err := Check(b, Backing{})
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: Check = %v, want %q", tt.name, err, tt.wantErr)
		}
	}
	if _, err := Parse(header()[:100]); err == nil {
		t.Error("a version 3 header cut at 100 bytes passed")
	}
}

// FuzzParse: Parse never panics, and what it accepts names a backing
// file only within the bytes it was given.
func FuzzParse(f *testing.F) {
	f.Add(header())
	b := header()
	binary.BigEndian.PutUint64(b[8:], 512)
	binary.BigEndian.PutUint32(b[16:], 4)
	f.Add(b)
	f.Add([]byte("QFI\xfb"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse(b)
		if err == nil && len(h.Backing) > len(b) {
			t.Fatalf("backing name of %d bytes from %d", len(h.Backing), len(b))
		}
	})
}
