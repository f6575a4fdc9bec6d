package wipe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// ataTimeout bounds the short ATA commands; an erase gets the drive's own
// estimate, or ataEraseDefault when it gives none.
const (
	ataTimeout      = 30 * time.Second
	ataEraseDefault = 12 * time.Hour
)

// ata runs one ATA command through ATA PASS-THROUGH (16).
func ata(d Device, command, protocol byte, data []byte, timeout time.Duration) error {
	dir := DirNone
	switch protocol {
	case protoPIOIn:
		dir = DirIn
	case protoPIOOut:
		dir = DirOut
	}
	return d.SCSI(ataCDB(command, protocol, 0), dir, data, timeout)
}

// ataIdentify reads IDENTIFY DEVICE; an error means the device takes no
// ATA commands (not SATA, or an HBA that does not pass them).
func ataIdentify(d Device) (ATASecurity, error) {
	buf := make([]byte, 512)
	if err := ata(d, ataCmdIdentify, protoPIOIn, buf, ataTimeout); err != nil {
		return ATASecurity{}, err
	}
	return ParseATAIdentify(buf)
}

// ataRefusal says why a drive's security state lets no erase start, and
// the way out; "" when it does.
func ataRefusal(s ATASecurity) string {
	switch {
	case !s.Supported:
		return "the drive has no ATA Security feature set (IDENTIFY word 82 bit 1 clear)"
	case s.Locked:
		return "the drive is locked by a password bcd did not set: unlock it with that password, or erase it with its master password"
	case s.Enabled:
		return "the drive has a user password bcd did not set: bcd does not erase a drive whose password it does not know; disable it with that password first"
	case s.CountExpired:
		return "the drive's password attempt counter is exhausted: power-cycle the drive, then wipe again"
	case s.Frozen:
		return "the drive's security is frozen (the firmware froze it at boot): suspend and resume the machine (echo mem > /sys/power/state) or hot-plug the drive to thaw it, then wipe again"
	}
	return ""
}

// ataErase is ATA SECURITY ERASE UNIT, enhanced where the drive offers
// it: a one-time user password is set (never logged), the erase prepared
// and run, and the drive's security read back disabled. If anything
// fails once the password is set, the password is disabled again, so
// the drive is never left locked.
func ataErase(d Device, s ATASecurity, r *Report) error {
	if why := ataRefusal(s); why != "" {
		return errors.New("secure-erase: ATA Security Erase: " + why)
	}
	enhanced := s.Enhanced
	timeout := s.EraseTime
	r.Method = "ATA SECURITY ERASE UNIT (normal) through SG_IO ATA PASS-THROUGH(16)"
	if enhanced {
		timeout = s.EnhancedTime
		r.Method = "ATA SECURITY ERASE UNIT (enhanced) through SG_IO ATA PASS-THROUGH(16)"
	}
	if timeout == 0 {
		timeout = ataEraseDefault
	} else {
		timeout = timeout*3/2 + 2*time.Minute
	}
	r.Controller = "ATA " + s.Model
	var raw [16]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return err
	}
	pw := "bcd" + hex.EncodeToString(raw[:])[:29]
	cs, err := plantCanaries(d, r)
	if err != nil {
		return err
	}
	if err := ata(d, ataSecuritySetPassword, protoPIOOut, securityPassword(pw, false), ataTimeout); err != nil {
		restoreCanaries(d, cs, r)
		return fmt.Errorf("secure-erase: setting a one-time user password: %w", err)
	}
	r.step("SECURITY SET PASSWORD: a one-time user password is set")
	disable := func(why error) error {
		if derr := ata(d, ataSecurityDisablePwd, protoPIOOut, securityPassword(pw, false), ataTimeout); derr != nil {
			return fmt.Errorf("secure-erase: %w; and disabling the one-time password failed too (%v): the drive may be LOCKED; its password is lost with this process, so erase it with the master password", why, derr)
		}
		r.step("SECURITY DISABLE PASSWORD: the one-time password is cleared again")
		return fmt.Errorf("secure-erase: %w (the one-time password is cleared again)", why)
	}
	if err := ata(d, ataSecurityErasePrep, protoNonData, nil, ataTimeout); err != nil {
		restoreCanaries(d, cs, r)
		return disable(fmt.Errorf("SECURITY ERASE PREPARE: %w", err))
	}
	start := time.Now()
	if err := ata(d, ataSecurityEraseUnit, protoPIOOut, securityPassword(pw, enhanced), timeout); err != nil {
		return disable(fmt.Errorf("SECURITY ERASE UNIT: %w", err))
	}
	r.step("SECURITY ERASE UNIT (%s) done in %v", map[bool]string{true: "enhanced", false: "normal"}[enhanced], time.Since(start).Round(time.Millisecond))
	after, err := ataIdentify(d)
	switch {
	case err != nil:
		return fmt.Errorf("secure-erase: IDENTIFY DEVICE after the erase: %w", err)
	case after.Enabled || after.Locked:
		return disable(errors.New("the drive still has a password after the erase"))
	}
	r.step("IDENTIFY DEVICE: security disabled again, as a completed erase leaves it")
	return checkCanaries(d, cs, r)
}

// scsiErase is SANITIZE (block erase for secure-erase, cryptographic
// erase for crypto-erase) or, for secure-erase where SANITIZE is not
// there, FORMAT UNIT; it waits for the device to finish, reading its
// progress with REQUEST SENSE.
func scsiErase(ctx context.Context, d Device, opts Options, r *Report) error {
	sa, what := byte(0x02), "BLOCK ERASE"
	if opts.Mode == CryptoErase {
		sa, what = 0x03, "CRYPTOGRAPHIC ERASE"
	}
	cs, err := plantCanaries(d, r)
	if err != nil {
		return err
	}
	cdb := make([]byte, 10)
	cdb[0], cdb[1] = scsiSanitize, 0x20|sa // IMMED: answer at once, then poll
	err = d.SCSI(cdb, DirNone, nil, ataTimeout)
	var cc *CheckCondition
	switch {
	case err == nil:
		r.Method = "SCSI SANITIZE " + what + " through SG_IO"
	case errors.As(err, &cc) && cc.Sense.unsupported() && opts.Mode == SecureErase:
		r.step("SANITIZE: %v", err)
		fu := make([]byte, 6)
		fu[0] = scsiFormatUnit
		fu[1] = 0x02 // IMMED-less, no parameter list: the device's default format
		timeout := opts.NVMeTimeout
		if timeout == 0 {
			timeout = ataEraseDefault
		}
		if err := d.SCSI(fu, DirNone, nil, timeout); err != nil {
			restoreCanaries(d, cs, r)
			return fmt.Errorf("secure-erase: the device supports neither SANITIZE nor FORMAT UNIT: %w", err)
		}
		r.Method = "SCSI FORMAT UNIT through SG_IO"
		r.step("FORMAT UNIT done")
		return checkCanaries(d, cs, r)
	default:
		restoreCanaries(d, cs, r)
		return fmt.Errorf("%s: SANITIZE %s: %w", opts.Mode, what, err)
	}
	deadline := opts.SanitizeTimeout
	if deadline == 0 {
		deadline = 6 * time.Hour
	}
	end := time.Now().Add(deadline)
	rs := []byte{scsiRequestSense, 0, 0, 0, 252, 0}
	for {
		buf := make([]byte, 252)
		if err := d.SCSI(rs, DirIn, buf, ataTimeout); err != nil {
			return fmt.Errorf("%s: REQUEST SENSE while sanitizing: %w", opts.Mode, err)
		}
		s, err := ParseSense(buf)
		if err != nil {
			return fmt.Errorf("%s: REQUEST SENSE while sanitizing: %w", opts.Mode, err)
		}
		if !(s.Key == keyNotReady && s.ASC == 0x04 && s.ASCQ == 0x1b) {
			if s.Key != keyNoSense && s.Key != keyRecovered {
				return fmt.Errorf("%s: SANITIZE ended with %v", opts.Mode, s)
			}
			r.step("SANITIZE %s done", what)
			return checkCanaries(d, cs, r)
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s: SANITIZE still in progress after %v (%v)", opts.Mode, deadline, s)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w while SANITIZE runs on the device (it goes on; the device stays unusable until it ends)", opts.Mode, ctx.Err())
		case <-time.After(sanitizePoll):
		}
	}
}

// notSCSI reports whether err says the device takes no SCSI commands at
// all (virtio, loop, a file): the SG_IO ioctl itself refused, no sense.
func notSCSI(err error) bool {
	var errno unix.Errno
	return errors.As(err, &errno) && (errno == unix.ENOTTY || errno == unix.EINVAL || errno == unix.EOPNOTSUPP || errno == unix.ENOSYS)
}
