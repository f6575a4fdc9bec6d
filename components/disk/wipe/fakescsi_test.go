package wipe

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeATA is a SATA drive's Security feature set, as its firmware keeps
// it.
type fakeATA struct {
	supported, frozen, enhanced, expired bool
	password                             string // "" when none is set
	locked                               bool
	failErase                            bool // ERASE UNIT aborts
	lie                                  bool // ERASE UNIT succeeds and erases nothing
	commands                             []string
}

// fakeSAS is a SAS disk: what it takes of SANITIZE and FORMAT UNIT.
type fakeSAS struct {
	sanitize, format bool
	polls            int // REQUEST SENSE answers "in progress" this often
	commands         []string
}

func aborted(op string) error {
	return &CheckCondition{Op: op, Sense: Sense{Key: 0xb, Progress: -1, ATA: true, ATAError: 0x04, ATAStatus: 0x51}}
}

func illegal(op string) error {
	return &CheckCondition{Op: op, Sense: Sense{Key: keyIllegalRequest, ASC: ascInvalidOpcode, Progress: -1}}
}

func (f *fakeDevice) SCSI(cdb []byte, dir Dir, data []byte, timeout time.Duration) error {
	op := cdbName(cdb)
	switch {
	case f.ata == nil && f.sas == nil:
		return fmt.Errorf("ioctl(/dev/fake, SG_IO, %s) = %w", op, unix.ENOTTY)
	case f.ata != nil && cdb[0] == scsiATAPassThrough16:
		return f.ata.run(f, cdb[14], data)
	case f.ata != nil:
		return illegal(op)
	case cdb[0] == scsiATAPassThrough16:
		return illegal(op)
	}
	s := f.sas
	s.commands = append(s.commands, op)
	switch cdb[0] {
	case scsiSanitize:
		if !s.sanitize {
			return illegal(op)
		}
		f.erase()
	case scsiFormatUnit:
		if !s.format {
			return illegal(op)
		}
		f.erase()
	case scsiRequestSense:
		clear(data)
		data[0], data[7] = 0x70, 10
		if s.polls > 0 {
			s.polls--
			data[2], data[12], data[13] = keyNotReady, 0x04, 0x1b
			data[15], data[16] = 0x80, 0x40 // 25%
		}
	default:
		return illegal(op)
	}
	return nil
}

func (a *fakeATA) run(f *fakeDevice, cmd byte, data []byte) error {
	op := ataName(cmd)
	a.commands = append(a.commands, op)
	pw := func() string { return strings.TrimRight(string(data[2:34]), "\x00") }
	switch cmd {
	case ataCmdIdentify:
		clear(data)
		copy(data[54:], "AFekaS AS DT 0001 ") // bytes swapped in each word
		var w82, w128 uint16
		if a.supported {
			w82 = 0x2
			w128 = 0x1
			if a.password != "" {
				w128 |= 0x2
			}
			if a.locked {
				w128 |= 0x4
			}
			if a.frozen {
				w128 |= 0x8
			}
			if a.expired {
				w128 |= 0x10
			}
			if a.enhanced {
				w128 |= 0x20
			}
		}
		binary.LittleEndian.PutUint16(data[164:], w82)
		binary.LittleEndian.PutUint16(data[256:], w128)
		binary.LittleEndian.PutUint16(data[178:], 1) // 2 minutes
		binary.LittleEndian.PutUint16(data[180:], 2)
	case ataSecuritySetPassword:
		if !a.supported || a.frozen || a.password != "" {
			return aborted(op)
		}
		a.password = pw()
	case ataSecurityErasePrep:
		if a.frozen {
			return aborted(op)
		}
	case ataSecurityEraseUnit:
		if a.frozen || a.password == "" || pw() != a.password || a.failErase {
			return aborted(op)
		}
		if !a.lie {
			clear(f.data)
		}
		a.password, a.locked = "", false
	case ataSecurityDisablePwd:
		if a.password == "" || pw() != a.password {
			return aborted(op)
		}
		a.password = ""
	default:
		return aborted(op)
	}
	return nil
}

// TestATASecurityErase: the security state machine of a SATA drive.
func TestATASecurityErase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ata     fakeATA
		wantErr string
		wantOps string
		erased  bool
	}{
		{name: "enhanced erase", ata: fakeATA{supported: true, enhanced: true}, erased: true,
			wantOps: "IDENTIFY DEVICE, SECURITY SET PASSWORD, SECURITY ERASE PREPARE, SECURITY ERASE UNIT, IDENTIFY DEVICE"},
		{name: "frozen", ata: fakeATA{supported: true, frozen: true}, wantErr: "frozen", wantOps: "IDENTIFY DEVICE"},
		{name: "locked", ata: fakeATA{supported: true, locked: true, password: "theirs"}, wantErr: "locked by a password bcd did not set", wantOps: "IDENTIFY DEVICE"},
		{name: "a password of someone else", ata: fakeATA{supported: true, password: "theirs"}, wantErr: "user password bcd did not set", wantOps: "IDENTIFY DEVICE"},
		{name: "count expired", ata: fakeATA{supported: true, expired: true}, wantErr: "power-cycle", wantOps: "IDENTIFY DEVICE"},
		{name: "no security feature set", ata: fakeATA{}, wantErr: "no ATA Security feature set", wantOps: "IDENTIFY DEVICE"},
		{name: "erase fails: the password is cleared again", ata: fakeATA{supported: true, failErase: true},
			wantErr: "the one-time password is cleared again",
			wantOps: "IDENTIFY DEVICE, SECURITY SET PASSWORD, SECURITY ERASE PREPARE, SECURITY ERASE UNIT, SECURITY DISABLE PASSWORD"},
		{name: "a drive that erases nothing is caught by the canaries", ata: fakeATA{supported: true, lie: true}, wantErr: "canary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newFake(64*MiB, 0)
			for i := range d.data {
				d.data[i] = 0xa5
			}
			a := tc.ata
			d.ata = &a
			rep, err := WipeDevice(t.Context(), d, Options{Mode: SecureErase})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("WipeDevice = %v\n%v", err, rep.Steps)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("WipeDevice = %v, want %q", err, tc.wantErr)
			}
			if tc.wantOps != "" && strings.Join(a.commands, ", ") != tc.wantOps {
				t.Errorf("commands %s", strings.Join(a.commands, ", "))
			}
			if a.password != "" && a.password != tc.ata.password {
				t.Errorf("the drive is left with bcd's password set")
			}
			if tc.erased != allZero(d.data) {
				t.Errorf("erased %v, want %v", allZero(d.data), tc.erased)
			}
			// Refused before SECURITY ERASE UNIT ran, the disk is as it
			// was (the canaries' blocks restored).
			if !tc.erased && !tc.ata.lie && !tc.ata.failErase && d.data[0] != 0xa5 {
				t.Errorf("a refused erase changed the disk")
			}
			for _, s := range rep.Steps {
				if a.password != "" && strings.Contains(s, a.password) {
					t.Errorf("a step shows the password: %s", s)
				}
			}
		})
	}
}

// TestSCSIErase: SANITIZE (waited on with REQUEST SENSE), FORMAT UNIT
// where SANITIZE is not there, and a device with neither refused with
// its data kept.
func TestSCSIErase(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    Mode
		sas     fakeSAS
		wantErr string
		method  string
	}{
		{name: "sanitize block erase", mode: SecureErase, sas: fakeSAS{sanitize: true, polls: 2}, method: "SCSI SANITIZE BLOCK ERASE through SG_IO"},
		{name: "sanitize crypto erase", mode: CryptoErase, sas: fakeSAS{sanitize: true}, method: "SCSI SANITIZE CRYPTOGRAPHIC ERASE through SG_IO"},
		{name: "format unit", mode: SecureErase, sas: fakeSAS{format: true}, method: "SCSI FORMAT UNIT through SG_IO"},
		{name: "neither", mode: SecureErase, sas: fakeSAS{}, wantErr: "supports neither SANITIZE nor FORMAT UNIT"},
		{name: "crypto without sanitize", mode: CryptoErase, sas: fakeSAS{format: true}, wantErr: "SANITIZE CRYPTOGRAPHIC ERASE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := sanitizePoll
			sanitizePoll = time.Millisecond
			defer func() { sanitizePoll = old }()
			d := newFake(64*MiB, 0)
			for i := range d.data {
				d.data[i] = 0x5a
			}
			s := tc.sas
			d.sas = &s
			rep, err := WipeDevice(t.Context(), d, Options{Mode: tc.mode})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("WipeDevice = %v, want %q", err, tc.wantErr)
				}
				if d.data[0] != 0x5a || d.data[len(d.data)/2] != 0x5a {
					t.Error("a refused erase changed the disk")
				}
				return
			}
			if err != nil || rep.Method != tc.method || !allZero(d.data) {
				t.Errorf("WipeDevice = %v, method %q, erased %v\n%v", err, rep.Method, allZero(d.data), rep.Steps)
			}
		})
	}
}

func TestParseSense(t *testing.T) {
	fixed := make([]byte, 18)
	fixed[0], fixed[2], fixed[12], fixed[13], fixed[15], fixed[16] = 0x70, 0x02, 0x04, 0x1b, 0x80, 0x80
	desc := []byte{0x72, 0x0b, 0x00, 0x00, 0, 0, 0, 14, 0x09, 12, 0, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x51}
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{fixed, "sense key NOT READY, ASC/ASCQ 04h/1bh, 50% done"},
		{desc, "sense key ABORTED COMMAND, ASC/ASCQ 00h/00h, ATA status 51h error 04h"},
	} {
		s, err := ParseSense(tc.b)
		if err != nil || s.String() != tc.want {
			t.Errorf("ParseSense(% x) = %v, %v; want %s", tc.b, s, err, tc.want)
		}
	}
	for _, bad := range [][]byte{nil, {0x70, 0, 0}, {0x72, 0, 0, 0, 0, 0, 0, 20}, {0x72, 0, 0, 0, 0, 0, 0, 2, 0x09, 5}, {0x10}} {
		if _, err := ParseSense(bad); err == nil {
			t.Errorf("ParseSense(% x) gave no error", bad)
		}
	}
}

func FuzzParseSense(f *testing.F) {
	f.Add([]byte{0x70, 0, 2, 0, 0, 0, 0, 10, 0, 0, 0, 0, 4, 0x1b, 0, 0x80, 0x40, 0})
	f.Add([]byte{0x72, 0x0b, 0, 0, 0, 0, 0, 14, 0x09, 12, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x51})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSense(b)
		if err == nil && (s.Key > 0xf || s.Progress > 65535) {
			t.Fatalf("ParseSense(% x) = %+v", b, s)
		}
		_ = s.String()
	})
}

func FuzzParseATAIdentify(f *testing.F) {
	f.Add(make([]byte, 512))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseATAIdentify(b)
		if err != nil {
			return
		}
		if s.Enabled && !s.Supported || len(s.Model) > 40 {
			t.Fatalf("ParseATAIdentify = %+v", s)
		}
	})
}

func allZero(b []byte) bool { return nonZero(b) < 0 }
