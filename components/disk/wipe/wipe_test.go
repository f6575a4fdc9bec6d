package wipe

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func init() { sanitizePoll = 5 * time.Millisecond }

func TestAdminCmdLayout(t *testing.T) {
	if n := unsafe.Sizeof(AdminCmd{}); n != 72 {
		t.Fatalf("AdminCmd is %d bytes, struct nvme_passthru_cmd is 72", n)
	}
	if off := unsafe.Offsetof(AdminCmd{}.Cdw10); off != 40 {
		t.Errorf("cdw10 at %d, want 40", off)
	}
	if off := unsafe.Offsetof(AdminCmd{}.TimeoutMs); off != 64 {
		t.Errorf("timeout_ms at %d, want 64", off)
	}
}

func TestFormatCdw10(t *testing.T) {
	for _, tc := range []struct {
		ns   Namespace
		ses  uint32
		want uint32
	}{
		{Namespace{}, sesUser, 1 << 9},
		{Namespace{}, sesCrypto, 2 << 9},
		{Namespace{LBAF: 1}, sesUser, 0x201},
		{Namespace{LBAF: 0x12, MSET: true, PI: 1, PIL: true}, sesNone, 0x2 | 1<<4 | 1<<5 | 1<<8 | 1<<12},
	} {
		if got := formatCdw10(tc.ns, tc.ses); got != tc.want {
			t.Errorf("formatCdw10(%+v, %d) = %#x, want %#x", tc.ns, tc.ses, got, tc.want)
		}
	}
}

func TestParseIdentify(t *testing.T) {
	b := make([]byte, 4096)
	copy(b[idSN:], "S123                ")
	copy(b[idMN:], "QEMU NVMe Ctrl                          ")
	binary.LittleEndian.PutUint16(b[idOACS:], 0x0002)
	binary.LittleEndian.PutUint32(b[idSANICAP:], 0x1)
	b[idFNA] = 0x5
	c, err := ParseIdentifyController(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Caps{Serial: "S123", Model: "QEMU NVMe Ctrl", FormatNVM: true, FormatAllNamespaces: true, CryptoEraseFormat: true, SanitizeCrypto: true}
	if c != want {
		t.Errorf("caps %+v, want %+v", c, want)
	}
	if _, err := ParseIdentifyController(b[:100]); err == nil {
		t.Error("short identify data accepted")
	}
	ns := make([]byte, 4096)
	ns[26], ns[29] = 0x31, 0x9 // LBAF 1 + upper bits 01, MSET; PI type 1, PIL
	n, err := ParseIdentifyNamespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	if n != (Namespace{LBAF: 0x11, MSET: true, PI: 1, PIL: true}) {
		t.Errorf("namespace %+v", n)
	}
}

func TestStatusError(t *testing.T) {
	for s, want := range map[uint32]string{
		0x4001: "NVMe status 0x4001: Invalid Command Opcode (SCT 0, SC 0x01), do not retry",
		0x010a: "NVMe status 0x10a: Invalid Format (SCT 1, SC 0x0a)",
		0x0277: "NVMe status 0x277: unknown status (SCT 2, SC 0x77)",
	} {
		if got := (StatusError{Status: s}).Error(); got != want {
			t.Errorf("%#x: %q, want %q", s, got, want)
		}
	}
}

func TestQuickSpans(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int64
		parts []Span
		want  []Span
	}{
		{"tiny", 4096, nil, []Span{{0, 4096}}},
		{"two MiB", 2 * MiB, nil, []Span{{0, 2 * MiB}}},
		{"disk", 64 * MiB, nil, []Span{{0, MiB}, {63 * MiB, MiB}}},
		{"partition at 1 MiB", 64 * MiB, []Span{{MiB, 62 * MiB}}, []Span{{0, 2 * MiB}, {62 * MiB, 2 * MiB}}},
		{"two partitions", 100 * MiB, []Span{{MiB, 20 * MiB}, {40 * MiB, 10 * MiB}},
			[]Span{{0, 2 * MiB}, {20 * MiB, MiB}, {40 * MiB, MiB}, {49 * MiB, MiB}, {99 * MiB, MiB}}},
		{"partition past the end ignored", 64 * MiB, []Span{{60 * MiB, 10 * MiB}}, []Span{{0, MiB}, {63 * MiB, MiB}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := quickSpans(tc.size, tc.parts); !slices.Equal(got, tc.want) {
				t.Errorf("quickSpans = %v, want %v", got, tc.want)
			}
		})
	}
}

// plantGPT writes a protective MBR and primary and backup GPT headers with
// one partition [first, last] (LBAs), with valid CRCs, so the kernel finds
// the partition on a loop device.
func plantGPT(t *testing.T, w interface {
	WriteAt([]byte, int64) (int, error)
}, size, first, last int64) {
	t.Helper()
	lbas := size / 512
	mbr := make([]byte, 512)
	mbr[446+4] = 0xee // protective partition
	binary.LittleEndian.PutUint32(mbr[446+8:], 1)
	binary.LittleEndian.PutUint32(mbr[446+12:], uint32(min(lbas-1, 0xffffffff)))
	mbr[510], mbr[511] = 0x55, 0xaa
	entries := make([]byte, 128*128)
	copy(entries[0:16], []byte{0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4}) // Linux filesystem
	copy(entries[16:32], bytes.Repeat([]byte{0x42}, 16))
	binary.LittleEndian.PutUint64(entries[32:], uint64(first))
	binary.LittleEndian.PutUint64(entries[40:], uint64(last))
	entriesCRC := crc32.ChecksumIEEE(entries)
	header := func(my, alt, entriesLBA int64) []byte {
		h := make([]byte, 512)
		copy(h, "EFI PART")
		binary.LittleEndian.PutUint32(h[8:], 0x00010000)
		binary.LittleEndian.PutUint32(h[12:], 92)
		binary.LittleEndian.PutUint64(h[24:], uint64(my))
		binary.LittleEndian.PutUint64(h[32:], uint64(alt))
		binary.LittleEndian.PutUint64(h[40:], 34)
		binary.LittleEndian.PutUint64(h[48:], uint64(lbas-34))
		copy(h[56:72], bytes.Repeat([]byte{0x24}, 16))
		binary.LittleEndian.PutUint64(h[72:], uint64(entriesLBA))
		binary.LittleEndian.PutUint32(h[80:], 128)
		binary.LittleEndian.PutUint32(h[84:], 128)
		binary.LittleEndian.PutUint32(h[88:], entriesCRC)
		binary.LittleEndian.PutUint32(h[16:], crc32.ChecksumIEEE(h[:92]))
		return h
	}
	for _, wr := range []struct {
		b   []byte
		off int64
	}{
		{mbr, 0},
		{header(1, lbas-1, 2), 512},
		{entries, 2 * 512},
		{entries, (lbas - 33) * 512},
		{header(lbas-1, 1, lbas-33), (lbas - 1) * 512},
	} {
		if _, err := w.WriteAt(wr.b, wr.off); err != nil {
			t.Fatal(err)
		}
	}
}

// plantFS writes an ext4 superblock magic at the start of a partition and
// an md RAID 1.0 superblock magic at its end.
func plantFS(t *testing.T, w interface {
	WriteAt([]byte, int64) (int, error)
}, part Span) {
	t.Helper()
	if _, err := w.WriteAt([]byte{0x53, 0xef}, part.Off+1080); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte{0xfc, 0x4e, 0x2b, 0xa9}, part.Off+part.Len/4096*4096-8192); err != nil {
		t.Fatal(err)
	}
}

const testSize = 64 * MiB

// testPart is the partition plantGPT makes: LBA 2048 up to 2 MiB before the
// end.
var testPart = Span{Off: 2048 * 512, Len: (testSize/512 - 4096 - 2048) * 512}

var wantFound = []string{
	"MBR/boot sector signature at 510 (disk)",
	"GPT header at 512 (disk)",
	"GPT backup header at 67108352 (disk)",
	"ext2/3/4 superblock at 1049656 (partition 1)",
	"md RAID 1.0 superblock at 65003520 (partition 1)",
}

func TestQuickFake(t *testing.T) {
	d := newFake(testSize, 0)
	plantGPT(t, d, testSize, 2048, testSize/512-4096-1)
	plantFS(t, d, testPart)
	d.parts = []Span{testPart}
	// Data outside the wiped spans stays.
	copy(d.data[10*MiB:], "user data")
	r, err := WipeDevice(context.Background(), d, Options{Mode: Quick})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || r.Error != "" {
		t.Errorf("report %+v", r)
	}
	if !slices.Equal(r.Found, wantFound) {
		t.Errorf("found\n %q\nwant\n %q", r.Found, wantFound)
	}
	wantSpans := quickSpans(testSize, d.parts)
	if !slices.Equal(r.Verified, wantSpans) {
		t.Errorf("verified %v, want %v", r.Verified, wantSpans)
	}
	for _, s := range wantSpans {
		if i := nonZero(d.data[s.Off:s.End()]); i >= 0 {
			t.Errorf("byte %d not zero", s.Off+int64(i))
		}
	}
	if !bytes.Equal(d.data[10*MiB:10*MiB+9], []byte("user data")) {
		t.Error("quick wiped outside its spans")
	}
	if got := detect(&window{parts: []struct {
		off int64
		b   []byte
	}{{0, d.data}}}, testSize, d.parts); len(got) != 0 {
		t.Errorf("signatures left: %v", got)
	}
}

// TestQuickReadsBack: writes that succeed and change nothing fail the wipe.
func TestQuickReadsBack(t *testing.T) {
	d := newFake(testSize, 0)
	plantGPT(t, d, testSize, 2048, testSize/512-4096-1)
	d.dropWrites = true
	r, err := WipeDevice(context.Background(), d, Options{Mode: Quick})
	if err == nil || !strings.Contains(err.Error(), "read back after writing zeros: byte 450 is 0xee") {
		t.Fatalf("WipeDevice = %v", err)
	}
	if r.OK || r.Error == "" || len(r.Verified) != 0 {
		t.Errorf("report %+v", r)
	}
}

func fill(d *fakeDevice) []byte {
	for i := range d.data {
		d.data[i] = byte(i*7 + 3)
	}
	return slices.Clone(d.data)
}

func TestErase(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mode      Mode
		nsid      uint32
		ctrl      fakeController
		override  *Caps
		secDisc   error
		wantErr   string   // "" for success
		wantOps   []uint8  // admin opcodes after the two Identify commands
		wantCdw10 []uint32 // of those commands
		method    string
	}{
		{
			name: "nvme secure-erase formats with SES=1 keeping the LBA format",
			mode: SecureErase, nsid: 1,
			ctrl:    fakeController{caps: Caps{FormatNVM: true}, lbaf: 1},
			wantOps: []uint8{opFormatNVM}, wantCdw10: []uint32{0x201},
			method: "NVMe Format NVM, Secure Erase Settings 1 (user data erase)",
		},
		{
			name: "nvme without Format NVM fails secure-erase",
			mode: SecureErase, nsid: 1,
			wantErr: "the controller does not support Format NVM (OACS bit 1 clear)",
		},
		{
			name: "nvme crypto-erase without FNA or SANICAP fails (QEMU)",
			mode: CryptoErase, nsid: 1,
			ctrl:    fakeController{caps: Caps{FormatNVM: true}},
			wantErr: "advertises no cryptographic erase: FNA bit 2 clear (Format NVM) and SANICAP bit 0 clear (Sanitize)",
		},
		{
			name: "nvme crypto-erase by format when FNA says so",
			mode: CryptoErase, nsid: 1,
			ctrl:    fakeController{caps: Caps{FormatNVM: true, CryptoEraseFormat: true, FormatAllNamespaces: true}},
			wantOps: []uint8{opFormatNVM}, wantCdw10: []uint32{0x400},
			method: "NVMe Format NVM, Secure Erase Settings 2 (cryptographic erase); the controller erases all its namespaces together (FNA)",
		},
		{
			name: "nvme crypto-erase prefers sanitize when SANICAP says so, and waits for it",
			mode: CryptoErase, nsid: 1,
			ctrl:    fakeController{caps: Caps{FormatNVM: true, CryptoEraseFormat: true, SanitizeCrypto: true}, sanitize: true, sanitizePolls: 2},
			wantOps: []uint8{opSanitize, opGetLogPage, opGetLogPage, opGetLogPage}, wantCdw10: []uint32{4, 0x7f0081, 0x7f0081, 0x7f0081},
			method: "NVMe Sanitize, crypto erase (every namespace of the controller)",
		},
		{
			// The test-only override exercises the command path on a
			// controller that does not advertise it but takes SES=2 (QEMU).
			name: "override exercises the format path",
			mode: CryptoErase, nsid: 1,
			ctrl:     fakeController{caps: Caps{FormatNVM: true}, anySES: true},
			override: &Caps{FormatNVM: true, CryptoEraseFormat: true},
			wantOps:  []uint8{opFormatNVM}, wantCdw10: []uint32{0x400},
			method: "NVMe Format NVM, Secure Erase Settings 2 (cryptographic erase)",
		},
		{
			name: "override meets a controller that refuses SES=2",
			mode: CryptoErase, nsid: 1,
			ctrl:     fakeController{caps: Caps{FormatNVM: true}},
			override: &Caps{FormatNVM: true, CryptoEraseFormat: true},
			wantErr:  "NVMe status 0x4002: Invalid Field in Command",
			wantOps:  []uint8{opFormatNVM}, wantCdw10: []uint32{0x400},
		},
		{
			name: "override claiming sanitize meets a controller without it",
			mode: CryptoErase, nsid: 1,
			ctrl:     fakeController{caps: Caps{FormatNVM: true}},
			override: &Caps{SanitizeCrypto: true},
			wantErr:  "NVMe status 0x4001: Invalid Command Opcode",
			wantOps:  []uint8{opSanitize}, wantCdw10: []uint32{4},
		},
		{
			name: "a controller that reports success and erases nothing is caught",
			mode: SecureErase, nsid: 1,
			ctrl:    fakeController{caps: Caps{FormatNVM: true}, lie: true},
			wantErr: "the erase reported success but the canary at 0 survived",
			wantOps: []uint8{opFormatNVM}, wantCdw10: []uint32{0x200},
		},
		{
			name:   "block device secure-erase by BLKSECDISCARD",
			mode:   SecureErase,
			method: "ioctl(BLKSECDISCARD) over the whole device",
		},
		{
			name: "block device without BLKSECDISCARD fails secure-erase",
			mode: SecureErase, secDisc: syscall.EOPNOTSUPP,
			wantErr: "takes neither ATA nor SCSI commands, and ioctl(/dev/fake, BLKSECDISCARD, [0, 67108864]) = operation not supported",
		},
		{
			name:    "block device crypto-erase fails",
			mode:    CryptoErase,
			wantErr: "is a block device that takes no SCSI commands, not an NVMe namespace: no cryptographic erase to ask for",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFake(testSize, tc.nsid)
			d.ctrl, d.secDiscard = tc.ctrl, tc.secDisc
			before := fill(d)
			r, err := WipeDevice(context.Background(), d, Options{Mode: tc.mode, TestCaps: tc.override})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("WipeDevice = %v, want %q", err, tc.wantErr)
				}
				if r.OK || r.Error != err.Error() {
					t.Errorf("report OK %v error %q", r.OK, r.Error)
				}
				// A mode the device cannot do leaves it as it was.
				if !tc.ctrl.lie && !bytes.Equal(d.data, before) {
					t.Error("a failed erase changed the device")
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if !r.OK || r.Method != tc.method || len(r.Verified) != 3 {
					t.Errorf("report %+v", r)
				}
				if nonZero(d.data) >= 0 {
					t.Error("the device was not erased")
				}
			}
			var ops []uint8
			var cdw []uint32
			for _, c := range d.admin {
				if c.Opcode != opIdentify {
					ops, cdw = append(ops, c.Opcode), append(cdw, c.Cdw10)
				}
			}
			if !slices.Equal(ops, tc.wantOps) || !slices.Equal(cdw, tc.wantCdw10) {
				t.Errorf("admin commands %v cdw10 %#x, want %v %#x", ops, cdw, tc.wantOps, tc.wantCdw10)
			}
			t.Logf("steps: %q", r.Steps)
		})
	}
}

// TestWipeFile runs the real device code on a regular file: quick reads
// back through the real read path; the erase modes refuse a file.
func TestWipeFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(testSize); err != nil {
		t.Fatal(err)
	}
	plantGPT(t, f, testSize, 2048, testSize/512-4096-1)
	plantFS(t, f, testPart)
	f.WriteAt([]byte("user data"), 10*MiB)
	f.Close()

	r, err := Wipe(context.Background(), p, Options{Mode: Quick})
	if err != nil {
		t.Fatal(err)
	}
	// A file has no kernel partitions, so only the disk's two ends are
	// wiped (the ext4 magic at 1 MiB + 1080 is outside them).
	if r.Kind != "regular file" || !r.OK || len(r.Verified) != 2 {
		t.Errorf("report %+v", r)
	}
	for _, want := range []string{"GPT header at 512 (disk)", "GPT backup header at 67108352 (disk)"} {
		if !slices.Contains(r.Found, want) {
			t.Errorf("found %q, lacks %q", r.Found, want)
		}
	}
	b, _ := os.ReadFile(p)
	if nonZero(b[:MiB]) >= 0 || nonZero(b[testSize-MiB:]) >= 0 {
		t.Error("the ends are not zero")
	}
	if string(b[10*MiB:10*MiB+9]) != "user data" {
		t.Error("quick wiped outside its spans")
	}

	sum := sha256.Sum256(b)
	for _, m := range []Mode{SecureErase, CryptoErase} {
		_, err := Wipe(context.Background(), p, Options{Mode: m})
		if err == nil || !strings.Contains(err.Error(), "is a regular file") {
			t.Errorf("%s on a file: %v", m, err)
		}
	}
	if b, _ := os.ReadFile(p); sha256.Sum256(b) != sum {
		t.Error("a refused erase changed the file")
	}
	if _, err := Wipe(context.Background(), p, Options{Mode: "shred"}); err == nil || !strings.Contains(err.Error(), `unknown mode "shred"`) {
		t.Errorf("unknown mode: %v", err)
	}
	if r, err := Wipe(context.Background(), filepath.Join(t.TempDir(), "none"), Options{Mode: Quick}); err == nil || r.Error == "" {
		t.Errorf("missing device: %v %+v", err, r)
	}
}

func TestSanitizeCancel(t *testing.T) {
	d := newFake(testSize, 1)
	d.ctrl = fakeController{caps: Caps{SanitizeCrypto: true}, sanitize: true, sanitizePolls: 1000}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := WipeDevice(ctx, d, Options{Mode: CryptoErase})
	if err == nil || !strings.Contains(err.Error(), "sanitize: still in progress") || !strings.Contains(err.Error(), "the controller goes on") {
		t.Fatalf("WipeDevice = %v", err)
	}
}
