// Package wipe erases disks for the ramdisk's disk.wipe command, in three
// modes, and reports per device what it did and what it verified:
//
//   - quick zeroes the partition tables and signatures at both ends of the
//     disk and of each partition the kernel knows (first and last MiB), then
//     reads them back past the page cache and fails on any byte that is
//     not zero. It lists the signatures it found before.
//   - secure-erase asks the device to erase all user data: NVMe Format NVM
//     with Secure Erase Settings 1, else ioctl(BLKSECDISCARD). ATA Security
//     Erase is not implemented yet and is reported as such.
//   - crypto-erase asks for a cryptographic erase: NVMe Sanitize (crypto
//     erase) when SANICAP advertises it, else Format NVM with SES=2 when FNA
//     advertises it.
//
// A device that cannot do the asked mode fails that mode; nothing is
// silently downgraded. An ioctl's success is not proof: before a
// secure or crypto erase, random canary blocks are written at the start,
// middle and end, and after it they must read back gone.
//
// Hardware sits behind Device: Open gives the real block device (or a
// regular file), and tests give a fake with a simulated NVMe controller.
package wipe

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Mode is a disk.wipe mode.
type Mode string

// The modes.
const (
	Quick       Mode = "quick"
	SecureErase Mode = "secure-erase"
	CryptoErase Mode = "crypto-erase"
)

// ParseMode checks a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Quick, SecureErase, CryptoErase:
		return m, nil
	}
	return "", fmt.Errorf("wipe: unknown mode %q (quick, secure-erase or crypto-erase)", s)
}

// MiB is what quick zeroes at each end.
const MiB = 1 << 20

// sanitizePoll is how often the Sanitize Status log is read.
var sanitizePoll = time.Second

// Options tune a wipe.
type Options struct {
	Mode Mode
	// NVMeTimeout bounds one Format NVM command (0: 1 hour) and the wait
	// for a sanitize to finish (0: 6 hours).
	NVMeTimeout, SanitizeTimeout time.Duration

	// TestCaps replaces what the NVMe controller advertises, to exercise
	// the command path on a controller that does not (QEMU's NVMe
	// advertises no crypto erase). For tests only: nothing outside tests
	// sets it.
	TestCaps *Caps
}

// Report is what one device's wipe did.
type Report struct {
	Device string `json:"device"`
	Mode   Mode   `json:"mode"`
	Kind   string `json:"kind"`
	Size   int64  `json:"size"`
	// Controller is the NVMe controller's identity and erase capabilities.
	Controller string `json:"controller,omitempty"`
	// Method is what erased the data.
	Method string `json:"method,omitempty"`
	// Found are the signatures seen before a quick wipe.
	Found []string `json:"found,omitempty"`
	// Steps are the operations, in order, each with its outcome.
	Steps []string `json:"steps"`
	// Verified are the byte ranges read back as zero (quick) or whose
	// canary read back gone (secure-erase, crypto-erase).
	Verified []Span `json:"verified,omitempty"`
	// ReadBack says how the medium was read back.
	ReadBack string `json:"read_back,omitempty"`
	OK       bool   `json:"ok"`
	Error    string `json:"error,omitempty"`
	Took     time.Duration
}

func (r *Report) step(format string, a ...any) { r.Steps = append(r.Steps, fmt.Sprintf(format, a...)) }

// Wipe opens path and wipes it. The report is always filled; the error is
// set exactly when Report.OK is false.
func Wipe(ctx context.Context, path string, opts Options) (Report, error) {
	d, err := Open(path)
	if err != nil {
		r := Report{Device: path, Mode: opts.Mode, Error: err.Error()}
		return r, err
	}
	defer d.Close()
	return WipeDevice(ctx, d, opts)
}

// WipeDevice wipes an open device.
func WipeDevice(ctx context.Context, d Device, opts Options) (Report, error) {
	start := time.Now()
	r := Report{Device: d.Path(), Mode: opts.Mode, Kind: d.Kind(), Size: d.Size(), ReadBack: d.ReadBackMethod()}
	var err error
	switch opts.Mode {
	case Quick:
		err = quick(ctx, d, &r)
	case SecureErase, CryptoErase:
		err = erase(ctx, d, opts, &r)
	default:
		_, err = ParseMode(string(opts.Mode))
	}
	r.Took = time.Since(start)
	if err != nil {
		err = fmt.Errorf("wipe %s %s: %w", opts.Mode, d.Path(), err)
		r.Error = err.Error()
		return r, err
	}
	r.OK = true
	return r, nil
}

// quickSpans are the ranges a quick wipe zeroes: the first and last MiB of
// the device and of each partition, merged.
func quickSpans(size int64, parts []Span) []Span {
	var spans []Span
	ends := func(s Span) {
		n := min(int64(MiB), s.Len)
		spans = append(spans, Span{s.Off, n}, Span{s.End() - n, n})
	}
	ends(Span{0, size})
	for _, p := range parts {
		if p.Off >= 0 && p.End() <= size && p.Len > 0 {
			ends(p)
		}
	}
	slices.SortFunc(spans, func(a, b Span) int { return int(a.Off - b.Off) })
	var out []Span
	for _, s := range spans {
		if s.Len <= 0 {
			continue
		}
		if n := len(out); n > 0 && s.Off <= out[n-1].End() {
			out[n-1].Len = max(out[n-1].End(), s.End()) - out[n-1].Off
			continue
		}
		out = append(out, s)
	}
	return out
}

func quick(ctx context.Context, d Device, r *Report) error {
	if d.Size() == 0 {
		return errors.New("the device is empty (size 0)")
	}
	parts, err := d.Partitions()
	if err != nil {
		return err
	}
	spans := quickSpans(d.Size(), parts)
	r.Method = fmt.Sprintf("zeroed the first and last MiB of the device and of its %d partitions", len(parts))

	// What is there now, for the report.
	before := &window{}
	for _, s := range spans {
		b := make([]byte, s.Len)
		if _, err := d.ReadBack(b, s.Off); err != nil {
			return err
		}
		before.add(s.Off, b)
	}
	r.Found = detect(before, d.Size(), parts)
	r.step("read %d spans, found %d signatures", len(spans), len(r.Found))

	zero := make([]byte, MiB)
	for _, s := range spans {
		if err := ctx.Err(); err != nil {
			return err
		}
		for off := s.Off; off < s.End(); off += MiB {
			n := min(int64(MiB), s.End()-off)
			if _, err := d.WriteAt(zero[:n], off); err != nil {
				return err
			}
		}
		r.step("pwrite zeros [%d, %d)", s.Off, s.End())
	}
	if err := d.Sync(); err != nil {
		return err
	}
	r.step("fsync")
	if err := d.RereadPartitions(); err != nil {
		// The kernel keeps its old view until the device is reopened; the
		// data is what counts, and it is checked below.
		r.step("%v (ignored)", err)
	} else if d.Kind() != "regular file" {
		r.step("ioctl(BLKRRPART) = 0")
	}

	if err := VerifyZero(d, spans); err != nil {
		return err
	}
	r.Verified = append(r.Verified, spans...)
	r.step("read back %d spans (%s): all zero", len(spans), d.ReadBackMethod())
	return nil
}

// ZeroSpans writes zeros over spans, syncs, and reads them back
// (VerifyZero). deploy uses it to leave a target unbootable.
func ZeroSpans(d Device, spans []Span) error {
	zero := make([]byte, MiB)
	for _, s := range spans {
		for off := s.Off; off < s.End(); off += MiB {
			n := min(int64(MiB), s.End()-off)
			if _, err := d.WriteAt(zero[:n], off); err != nil {
				return err
			}
		}
	}
	if err := d.Sync(); err != nil {
		return err
	}
	return VerifyZero(d, spans)
}

// VerifyZero reads spans back from the medium and fails on the first byte
// that is not zero.
func VerifyZero(d Device, spans []Span) error {
	buf := make([]byte, MiB)
	for _, s := range spans {
		for off := s.Off; off < s.End(); off += MiB {
			n := min(int64(MiB), s.End()-off)
			b := buf[:n]
			if _, err := d.ReadBack(b, off); err != nil {
				return err
			}
			if i := nonZero(b); i >= 0 {
				return fmt.Errorf("read back after writing zeros: byte %d is %#02x (%s)", off+int64(i), b[i], d.ReadBackMethod())
			}
		}
	}
	return nil
}

func nonZero(b []byte) int {
	for i, c := range b {
		if c != 0 {
			return i
		}
	}
	return -1
}

// canaries are the blocks written before a secure or crypto erase: 4 KiB at
// the start, the middle and the end.
func canaries(size int64) []Span {
	const n = 4096
	if size < 3*n {
		return []Span{{0, min(size, n)}}
	}
	mid := size / 2 / n * n
	return []Span{{0, n}, {mid, n}, {size/n*n - n, n}}
}

// canary is one block written before an erase, with what it replaced.
type canary struct {
	off       int64
	data, old []byte
}

func plantCanaries(d Device, r *Report) ([]canary, error) {
	var cs []canary
	for _, s := range canaries(d.Size()) {
		c := canary{off: s.Off, data: make([]byte, s.Len), old: make([]byte, s.Len)}
		if _, err := d.ReadBack(c.old, c.off); err != nil {
			return nil, err
		}
		rand.Read(c.data)
		cs = append(cs, c)
	}
	for _, c := range cs {
		if _, err := d.WriteAt(c.data, c.off); err != nil {
			restoreCanaries(d, cs, r)
			return nil, err
		}
	}
	if err := d.Sync(); err != nil {
		return nil, err
	}
	// The canaries must be on the medium, or their absence later proves
	// nothing.
	for _, c := range cs {
		got := make([]byte, len(c.data))
		if _, err := d.ReadBack(got, c.off); err != nil {
			return nil, err
		}
		if !bytes.Equal(got, c.data) {
			return nil, fmt.Errorf("canary at %d did not read back before the erase (%s)", c.off, d.ReadBackMethod())
		}
	}
	r.step("wrote and read back %d random 4 KiB canaries", len(cs))
	return cs, nil
}

// restoreCanaries puts back what the canaries replaced when the erase
// failed, so a device that cannot do the mode is left as it was.
func restoreCanaries(d Device, cs []canary, r *Report) {
	for _, c := range cs {
		if _, err := d.WriteAt(c.old, c.off); err != nil {
			r.step("restoring the block under the canary at %d: %v", c.off, err)
			return
		}
	}
	if err := d.Sync(); err != nil {
		r.step("restoring the blocks under the canaries: %v", err)
		return
	}
	r.step("the erase failed: restored the %d blocks under the canaries", len(cs))
}

func checkCanaries(d Device, cs []canary, r *Report) error {
	zeros := true
	for _, c := range cs {
		got := make([]byte, len(c.data))
		if _, err := d.ReadBack(got, c.off); err != nil {
			return err
		}
		if bytes.Equal(got, c.data) {
			// Nothing was erased: the device is put back as it was.
			restoreCanaries(d, cs, r)
			return fmt.Errorf("the erase reported success but the canary at %d survived (%s)", c.off, d.ReadBackMethod())
		}
		if nonZero(got) >= 0 {
			zeros = false
		}
		r.Verified = append(r.Verified, Span{c.off, int64(len(c.data))})
	}
	what := "zeros"
	if !zeros {
		what = "other bytes (the medium's pattern for erased blocks)"
	}
	r.step("read back %d canaries (%s): all gone, %s", len(cs), d.ReadBackMethod(), what)
	return nil
}

func erase(ctx context.Context, d Device, opts Options, r *Report) error {
	if d.Size() == 0 {
		return errors.New("the device is empty (size 0)")
	}
	if d.Kind() == "regular file" {
		return fmt.Errorf("%s: %s is a regular file: there is no device to ask for an erase", opts.Mode, d.Path())
	}
	if d.NSID() == 0 {
		return eraseBlock(ctx, d, opts, r)
	}
	caps, ns, err := identify(d, r)
	if err != nil {
		return err
	}
	if opts.TestCaps != nil {
		caps = *opts.TestCaps
		r.step("capabilities replaced for a test: %v", caps)
	}
	r.Controller = caps.String()
	// run erases; it sets accepted once the controller took the command,
	// after which the blocks under the canaries must not be restored.
	accepted := false
	var run func() error
	switch opts.Mode {
	case SecureErase:
		if !caps.FormatNVM {
			return errors.New("secure-erase: the controller does not support Format NVM (OACS bit 1 clear); no other secure erase is tried")
		}
		r.Method = "NVMe Format NVM, Secure Erase Settings 1 (user data erase)"
		if caps.FormatAllNamespaces || caps.SecureEraseAllNamespaces {
			r.Method += "; the controller erases all its namespaces together (FNA)"
		}
		run = func() error { return format(d, opts, ns, sesUser, r, &accepted) }
	case CryptoErase:
		switch {
		case caps.SanitizeCrypto:
			r.Method = "NVMe Sanitize, crypto erase (every namespace of the controller)"
			run = func() error { return sanitize(ctx, d, opts, r, &accepted) }
		case caps.CryptoEraseFormat:
			r.Method = "NVMe Format NVM, Secure Erase Settings 2 (cryptographic erase)"
			if caps.FormatAllNamespaces || caps.SecureEraseAllNamespaces {
				r.Method += "; the controller erases all its namespaces together (FNA)"
			}
			run = func() error { return format(d, opts, ns, sesCrypto, r, &accepted) }
		default:
			return errors.New("crypto-erase: the controller advertises no cryptographic erase: FNA bit 2 clear (Format NVM) and SANICAP bit 0 clear (Sanitize)")
		}
	}
	cs, err := plantCanaries(d, r)
	if err != nil {
		return err
	}
	if err := run(); err != nil {
		if !accepted {
			restoreCanaries(d, cs, r)
		}
		return err
	}
	return checkCanaries(d, cs, r)
}

func identify(d Device, r *Report) (Caps, Namespace, error) {
	ctrl := make([]byte, 4096)
	cmd := AdminCmd{Opcode: opIdentify, Cdw10: 1}
	if err := d.Admin(&cmd, ctrl); err != nil {
		return Caps{}, Namespace{}, err
	}
	caps, err := ParseIdentifyController(ctrl)
	if err != nil {
		return Caps{}, Namespace{}, err
	}
	r.step("Identify Controller: %v", caps)
	nsb := make([]byte, 4096)
	cmd = AdminCmd{Opcode: opIdentify, NSID: d.NSID(), Cdw10: 0}
	if err := d.Admin(&cmd, nsb); err != nil {
		return Caps{}, Namespace{}, err
	}
	ns, err := ParseIdentifyNamespace(nsb)
	if err != nil {
		return Caps{}, Namespace{}, err
	}
	r.step("Identify Namespace %d: LBA format %d, metadata-extended %v, PI type %d", d.NSID(), ns.LBAF, ns.MSET, ns.PI)
	return caps, ns, nil
}

func format(d Device, opts Options, ns Namespace, ses uint32, r *Report, accepted *bool) error {
	timeout := opts.NVMeTimeout
	if timeout == 0 {
		timeout = time.Hour
	}
	cmd := AdminCmd{Opcode: opFormatNVM, NSID: d.NSID(), Cdw10: formatCdw10(ns, ses), TimeoutMs: uint32(timeout.Milliseconds())}
	t := time.Now()
	if err := d.Admin(&cmd, nil); err != nil {
		return err
	}
	*accepted = true
	r.step("Format NVM %v = 0 in %.1fs", &cmd, time.Since(t).Seconds())
	return nil
}

func sanitize(ctx context.Context, d Device, opts Options, r *Report, accepted *bool) error {
	cmd := AdminCmd{Opcode: opSanitize, Cdw10: sanactCryptoErase}
	if err := d.Admin(&cmd, nil); err != nil {
		return err
	}
	*accepted = true
	r.step("Sanitize %v = 0", &cmd)
	timeout := opts.SanitizeTimeout
	if timeout == 0 {
		timeout = 6 * time.Hour
	}
	deadline := time.Now().Add(timeout)
	for {
		log := make([]byte, 512)
		get := AdminCmd{Opcode: opGetLogPage, NSID: 0xffffffff, Cdw10: logSanitizeStatus | (uint32(len(log)/4-1) << 16)}
		if err := d.Admin(&get, log); err != nil {
			return err
		}
		sprog, sstat := uint16(log[0])|uint16(log[1])<<8, (uint16(log[2])|uint16(log[3])<<8)&7
		switch sstat {
		case sstatDone, sstatDoneNoDeal:
			r.step("Sanitize Status: completed (SSTAT %d)", sstat)
			return nil
		case sstatFailed:
			return errors.New("sanitize: the controller reports the sanitize failed (SSTAT 3)")
		case sstatInProgress:
		default:
			return fmt.Errorf("sanitize: unexpected Sanitize Status %d after the command", sstat)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sanitize: still in progress (%d/65536) after %v", sprog, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sanitize: still in progress (%d/65536): %w (the controller goes on)", sprog, ctx.Err())
		case <-time.After(sanitizePoll):
		}
	}
}

// eraseBlock is secure-erase or crypto-erase on a device that is not an
// NVMe namespace: a SATA drive (it answers IDENTIFY DEVICE through ATA
// PASS-THROUGH) gets ATA Security Erase; a SCSI device SANITIZE, else
// (secure-erase) FORMAT UNIT; a device that takes no SCSI command
// (virtio) ioctl(BLKSECDISCARD). A device that can do none of them is
// refused, each attempt named, and keeps its data.
func eraseBlock(ctx context.Context, d Device, opts Options, r *Report) error {
	s, err := ataIdentify(d)
	if err == nil {
		r.step("IDENTIFY DEVICE: %s, security supported %v, enabled %v, locked %v, frozen %v, enhanced erase %v",
			s.Model, s.Supported, s.Enabled, s.Locked, s.Frozen, s.Enhanced)
		if opts.Mode == CryptoErase {
			return fmt.Errorf("crypto-erase: %s is an ATA drive; ATA and Opal cryptographic erase are not implemented (secure-erase runs ATA Security Erase)", d.Path())
		}
		return ataErase(d, s, r)
	}
	r.step("IDENTIFY DEVICE through ATA PASS-THROUGH(16): %v", err)
	if !notSCSI(err) {
		return scsiErase(ctx, d, opts, r)
	}
	if opts.Mode == CryptoErase {
		return fmt.Errorf("crypto-erase: %s is a %s that takes no SCSI commands, not an NVMe namespace: no cryptographic erase to ask for", d.Path(), d.Kind())
	}
	r.Method = "ioctl(BLKSECDISCARD) over the whole device"
	cs, err := plantCanaries(d, r)
	if err != nil {
		return err
	}
	if err := d.SecureDiscard(0, d.Size()); err != nil {
		restoreCanaries(d, cs, r)
		return fmt.Errorf("secure-erase: %s takes neither ATA nor SCSI commands, and %w", d.Path(), err)
	}
	r.step("ioctl(BLKSECDISCARD, [0, %d]) = 0", d.Size())
	return checkCanaries(d, cs, r)
}
