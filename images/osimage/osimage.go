// Package osimage builds the test "installed OS" disk image that the QEMU
// tests deploy with deploy.image: an MBR partition table with one Linux
// partition from 1 MiB to the end, holding an ext4 file system (made by
// mkfs.ext4 -d from a staged tree, no root needed) with the kernel and
// the OS's initramfs under /boot (the node role and initramfs/osinit as
// its init), an empty /etc/bcd for deploy.image to fill, and
// /var/lib/bcd. The image is written zstd-compressed, streamed, with its
// SHA-256 next to it in sha256sum's format.
package osimage

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/klauspost/compress/zstd"

	"github.com/better-compute/bcd/initramfs"
)

// Layout of the image.
const (
	MiB = 1 << 20
	// PartitionStart is partition 1's first byte (LBA 2048).
	PartitionStart = 1 * MiB
	// DefaultSize is the whole disk image.
	DefaultSize = 96 * MiB
	// Label is the ext4 file system's label.
	Label = "bcd-os"
	// KernelPath and InitrdPath are where boot.kexec finds them in
	// partition 1.
	KernelPath = "boot/vmlinuz"
	InitrdPath = "boot/initramfs.cpio.zst"
)

// Config is one build.
type Config struct {
	Kernel, Initramfs string // files to put under /boot
	Output            string // the .img.zst to write
	Size              int64  // default DefaultSize
}

// Result describes the image built.
type Result struct {
	RawSize, Size int64
	SHA256        string
}

// Build writes the image.
func Build(ctx context.Context, c Config) (*Result, error) {
	if c.Size == 0 {
		c.Size = DefaultSize
	}
	if c.Size < 8*MiB || c.Size%512 != 0 {
		return nil, fmt.Errorf("osimage: size %d: must be a multiple of 512 of at least 8 MiB", c.Size)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return nil, fmt.Errorf("osimage: mkfs.ext4 is not installed (apt-get install e2fsprogs): %w", err)
	}
	tmp, err := os.MkdirTemp("", "bcd-osimage-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	stage := filepath.Join(tmp, "root")
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{{"boot", 0o755}, {"etc/bcd", 0o755}, {"var/lib/bcd", 0o700}} {
		if err := os.MkdirAll(filepath.Join(stage, d.p), d.mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(filepath.Join(stage, d.p), d.mode); err != nil {
			return nil, err
		}
	}
	for src, dst := range map[string]string{c.Kernel: KernelPath, c.Initramfs: InitrdPath} {
		if err := initramfs.CopyFile(src, filepath.Join(stage, dst), 0o644); err != nil {
			return nil, err
		}
	}
	release := "NAME=\"bcd test OS\"\nID=bcd-test\nPRETTY_NAME=\"bcd test installed OS (images/osimage)\"\n"
	if err := os.WriteFile(filepath.Join(stage, "etc/os-release"), []byte(release), 0o644); err != nil {
		return nil, err
	}

	fsImg := filepath.Join(tmp, "fs.img")
	fsSize := c.Size - PartitionStart
	if err := os.WriteFile(fsImg, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(fsImg, fsSize); err != nil {
		return nil, err
	}
	mkfs := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", Label, "-E", "root_owner=0:0", "-d", stage, fsImg)
	if out, err := mkfs.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("osimage: mkfs.ext4 -d: %v\n%s", err, out)
	}

	// The disk: MBR, zeros to 1 MiB, the file system; straight into zstd.
	fs, err := os.Open(fsImg)
	if err != nil {
		return nil, err
	}
	defer fs.Close()
	part := c.Output + ".part"
	out, err := os.Create(part)
	if err != nil {
		return nil, err
	}
	defer os.Remove(part)
	h := sha256.New()
	cw := &counter{w: io.MultiWriter(out, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		out.Close()
		return nil, err
	}
	head := make([]byte, PartitionStart)
	copy(head, MBR(PartitionStart/512, uint32(fsSize/512)))
	if _, err := zw.Write(head); err != nil {
		out.Close()
		return nil, err
	}
	if _, err := io.Copy(zw, fs); err != nil {
		out.Close()
		return nil, err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return nil, err
	}
	if err := out.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(part, c.Output); err != nil {
		return nil, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	line := sum + "  " + filepath.Base(c.Output) + "\n"
	if err := os.WriteFile(c.Output+".sha256", []byte(line), 0o644); err != nil {
		return nil, err
	}
	return &Result{RawSize: c.Size, Size: cw.n, SHA256: sum}, nil
}

// MBR returns a 512-byte master boot record with one Linux (0x83)
// partition of sectors sectors from LBA start.
func MBR(start, sectors uint32) []byte {
	b := make([]byte, 512)
	binary.LittleEndian.PutUint32(b[440:], 0xbcd05000) // disk signature
	e := b[446:462]
	e[0] = 0x00                            // not active
	copy(e[1:4], []byte{0xfe, 0xff, 0xff}) // CHS: use the LBA fields
	e[4] = 0x83
	copy(e[5:8], []byte{0xfe, 0xff, 0xff})
	binary.LittleEndian.PutUint32(e[8:], start)
	binary.LittleEndian.PutUint32(e[12:], sectors)
	b[510], b[511] = 0x55, 0xaa
	return b
}

type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
