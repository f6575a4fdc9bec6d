package wipe

import (
	"bytes"
	"fmt"
)

// window holds bytes read at known offsets of a device.
type window struct {
	parts []struct {
		off int64
		b   []byte
	}
}

func (w *window) add(off int64, b []byte) {
	w.parts = append(w.parts, struct {
		off int64
		b   []byte
	}{off, b})
}

// at returns n bytes at off when one read part holds them all.
func (w *window) at(off int64, n int) []byte {
	if off < 0 {
		return nil
	}
	for _, p := range w.parts {
		if off >= p.off && off+int64(n) <= p.off+int64(len(p.b)) {
			return p.b[off-p.off : off-p.off+int64(n)]
		}
	}
	return nil
}

// signature is a magic value at a fixed offset from the start (or, for
// negative offsets, from the end) of a disk or partition.
type signature struct {
	name  string
	off   int64 // from the start; negative: from the end, see endAlign
	magic string
	// endAlign rounds the end down first (md superblocks sit at an aligned
	// distance from the end).
	endAlign int64
}

var signatures = []signature{
	{name: "MBR/boot sector signature", off: 510, magic: "\x55\xaa"},
	{name: "GPT header", off: 512, magic: "EFI PART"},
	{name: "GPT header (4K sectors)", off: 4096, magic: "EFI PART"},
	{name: "GPT backup header", off: -512, magic: "EFI PART"},
	{name: "GPT backup header (4K sectors)", off: -4096, magic: "EFI PART"},
	{name: "ext2/3/4 superblock", off: 1080, magic: "\x53\xef"},
	{name: "XFS superblock", off: 0, magic: "XFSB"},
	{name: "btrfs superblock", off: 65600, magic: "_BHRfS_M"},
	{name: "LUKS header", off: 0, magic: "LUKS\xba\xbe"},
	{name: "LVM2 label", off: 512, magic: "LABELONE"},
	{name: "swap signature", off: 4086, magic: "SWAPSPACE2"},
	{name: "NTFS boot sector", off: 3, magic: "NTFS    "},
	{name: "FAT32 boot sector", off: 82, magic: "FAT32   "},
	{name: "ISO 9660 volume descriptor", off: 32769, magic: "CD001"},
	{name: "md RAID 1.1 superblock", off: 0, magic: "\xfc\x4e\x2b\xa9"},
	{name: "md RAID 1.2 superblock", off: 4096, magic: "\xfc\x4e\x2b\xa9"},
	{name: "md RAID 1.0 superblock", off: -8192, magic: "\xfc\x4e\x2b\xa9", endAlign: 4096},
	{name: "md RAID 0.90 superblock", off: -65536, magic: "\xfc\x4e\x2b\xa9", endAlign: 65536},
}

// detect lists the signatures w holds for the disk and each partition.
func detect(w *window, size int64, parts []Span) []string {
	var out []string
	check := func(what string, s Span) {
		for _, sig := range signatures {
			off := s.Off + sig.off
			if sig.off < 0 {
				end := s.End()
				if sig.endAlign > 0 {
					end = s.Off + (s.Len/sig.endAlign)*sig.endAlign
				}
				off = end + sig.off
			}
			if off < s.Off || off+int64(len(sig.magic)) > s.End() {
				continue
			}
			if b := w.at(off, len(sig.magic)); b != nil && bytes.Equal(b, []byte(sig.magic)) {
				out = append(out, fmt.Sprintf("%s at %d (%s)", sig.name, off, what))
			}
		}
	}
	check("disk", Span{0, size})
	for i, p := range parts {
		check(fmt.Sprintf("partition %d", i+1), p)
	}
	return out
}
