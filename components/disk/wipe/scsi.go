package wipe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// SATA and SAS disks are erased with SCSI commands through SG_IO: a SATA
// disk behind libata (AHCI) or a SAT layer (many HBAs) takes ATA
// commands wrapped in ATA PASS-THROUGH (16); a SAS disk takes SANITIZE or
// FORMAT UNIT. What a device answers is a SCSI status and, on CHECK
// CONDITION, sense data, which ParseSense reads.

// CheckCondition is a SCSI command that ended in CHECK CONDITION, with
// its sense.
type CheckCondition struct {
	Op    string
	Sense Sense
}

func (e *CheckCondition) Error() string {
	return fmt.Sprintf("%s: CHECK CONDITION: %v", e.Op, e.Sense)
}

// Sense is the part of SCSI sense data a wipe acts on.
type Sense struct {
	Key, ASC, ASCQ byte
	// Progress is the sense-key-specific progress indication (0 to
	// 65535 of 65536) of an operation in progress, -1 when absent.
	Progress int
	// ATA holds the ATA Status Return descriptor of an ATA PASS-THROUGH
	// that failed: the ATA error and status registers.
	ATA                 bool
	ATAError, ATAStatus byte
}

var senseKeys = []string{"NO SENSE", "RECOVERED ERROR", "NOT READY", "MEDIUM ERROR", "HARDWARE ERROR",
	"ILLEGAL REQUEST", "UNIT ATTENTION", "DATA PROTECT", "BLANK CHECK", "VENDOR SPECIFIC", "COPY ABORTED",
	"ABORTED COMMAND", "RESERVED", "VOLUME OVERFLOW", "MISCOMPARE", "COMPLETED"}

func (s Sense) String() string {
	out := fmt.Sprintf("sense key %s, ASC/ASCQ %02xh/%02xh", senseKeys[s.Key&0xf], s.ASC, s.ASCQ)
	if s.Progress >= 0 {
		out += fmt.Sprintf(", %d%% done", s.Progress*100/65536)
	}
	if s.ATA {
		out += fmt.Sprintf(", ATA status %02xh error %02xh", s.ATAStatus, s.ATAError)
	}
	return out
}

// Sense keys and codes a wipe tells apart.
const (
	keyNotReady       = 0x2
	keyIllegalRequest = 0x5
	keyRecovered      = 0x1
	keyNoSense        = 0x0
	ascInvalidOpcode  = 0x20
	ascInvalidField   = 0x24
)

// unsupported reports whether a command was refused as one the device
// does not have: ILLEGAL REQUEST, invalid command operation code or an
// invalid field in the CDB (a SAT layer's answer to an ATA command it
// does not pass).
func (s Sense) unsupported() bool {
	return s.Key == keyIllegalRequest && (s.ASC == ascInvalidOpcode || s.ASC == ascInvalidField)
}

// ParseSense reads fixed (70h/71h) or descriptor (72h/73h) format sense
// data. Bytes it cannot read are an error; a sense it reads has Progress
// -1 unless a progress indication was given.
func ParseSense(b []byte) (Sense, error) {
	s := Sense{Progress: -1}
	if len(b) < 1 {
		return s, errors.New("sense: empty")
	}
	switch code := b[0] & 0x7f; code {
	case 0x70, 0x71:
		if len(b) < 14 {
			return s, fmt.Errorf("sense: fixed format in %d bytes, want at least 14", len(b))
		}
		s.Key, s.ASC, s.ASCQ = b[2]&0xf, b[12], b[13]
		if len(b) >= 18 && b[15]&0x80 != 0 && (s.Key == keyNotReady || s.Key == keyNoSense) {
			s.Progress = int(binary.BigEndian.Uint16(b[16:18]))
		}
	case 0x72, 0x73:
		if len(b) < 8 {
			return s, fmt.Errorf("sense: descriptor format in %d bytes, want at least 8", len(b))
		}
		s.Key, s.ASC, s.ASCQ = b[1]&0xf, b[2], b[3]
		n := int(b[7])
		if 8+n > len(b) {
			return s, fmt.Errorf("sense: descriptors of %d bytes in %d", n, len(b)-8)
		}
		for d := b[8 : 8+n]; len(d) > 0; {
			if len(d) < 2 || 2+int(d[1]) > len(d) {
				return s, errors.New("sense: a descriptor runs past the end")
			}
			body := d[2 : 2+int(d[1])]
			switch d[0] {
			case 0x02: // sense key specific
				if len(body) >= 6 && body[2]&0x80 != 0 {
					s.Progress = int(binary.BigEndian.Uint16(body[3:5]))
				}
			case 0x09: // ATA status return
				if len(body) >= 12 {
					s.ATA, s.ATAError, s.ATAStatus = true, body[1], body[11]
				}
			}
			d = d[2+int(d[1]):]
		}
	default:
		return s, fmt.Errorf("sense: response code %02xh is neither fixed nor descriptor format", code)
	}
	return s, nil
}

// ATA commands and SCSI operation codes used.
const (
	ataCmdIdentify         = 0xec
	ataSecuritySetPassword = 0xf1
	ataSecurityErasePrep   = 0xf3
	ataSecurityEraseUnit   = 0xf4
	ataSecurityDisablePwd  = 0xf6

	scsiATAPassThrough16 = 0x85
	scsiSanitize         = 0x48
	scsiFormatUnit       = 0x04
	scsiRequestSense     = 0x03
)

// ATA PASS-THROUGH protocols.
const (
	protoNonData = 3
	protoPIOIn   = 4
	protoPIOOut  = 5
)

// ataCDB is an ATA PASS-THROUGH (16) CDB for command with one 512-byte
// data sector (PIO in or out) or none. An ATA error comes back as CHECK
// CONDITION with the ATA status return descriptor.
func ataCDB(command byte, protocol byte, features byte) []byte {
	cdb := make([]byte, 16)
	cdb[0] = scsiATAPassThrough16
	cdb[1] = protocol << 1
	switch protocol {
	case protoPIOIn:
		cdb[2] = 0x08 | 0x04 | 0x02 // T_DIR in, BYT_BLOK, T_LENGTH in the sector count
		cdb[6] = 1
	case protoPIOOut:
		cdb[2] = 0x04 | 0x02
		cdb[6] = 1
	default:
		cdb[2] = 0
	}
	cdb[4] = features
	cdb[14] = command
	return cdb
}

// ATASecurity is what IDENTIFY DEVICE says of a drive's Security feature
// set (ATA8-ACS words 82, 89, 90 and 128).
type ATASecurity struct {
	Model                          string
	Supported, Enabled, Locked     bool
	Frozen, CountExpired, Enhanced bool
	// EraseTime and EnhancedTime are the drive's estimates; 0 when it
	// gives none.
	EraseTime, EnhancedTime time.Duration
}

// ParseATAIdentify reads the 512 bytes of IDENTIFY DEVICE.
func ParseATAIdentify(b []byte) (ATASecurity, error) {
	var s ATASecurity
	if len(b) != 512 {
		return s, fmt.Errorf("IDENTIFY DEVICE: %d bytes, want 512", len(b))
	}
	w := func(i int) uint16 { return binary.LittleEndian.Uint16(b[2*i:]) }
	// The model, words 27 to 46, bytes swapped in each word.
	var model []byte
	for i := 27; i <= 46; i++ {
		model = append(model, byte(w(i)>>8), byte(w(i)))
	}
	s.Model = strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return -1
		}
		return r
	}, string(model)))
	valid := func(v uint16) bool { return v != 0 && v != 0xffff }
	if v := w(82); valid(v) && v&0x2 != 0 {
		s.Supported = true
	}
	if v := w(128); valid(v) && v&0x1 != 0 {
		s.Supported = true
		s.Enabled, s.Locked, s.Frozen = v&0x2 != 0, v&0x4 != 0, v&0x8 != 0
		s.CountExpired, s.Enhanced = v&0x10 != 0, v&0x20 != 0
	}
	erase := func(v uint16) time.Duration {
		switch {
		case v == 0 || v == 0xffff:
			return 0
		case v&0x8000 != 0: // extended format: 2-minute units in bits 14:0
			return time.Duration(v&0x7fff) * 2 * time.Minute
		}
		return time.Duration(v&0xff) * 2 * time.Minute
	}
	s.EraseTime, s.EnhancedTime = erase(w(89)), erase(w(90))
	return s, nil
}

// securityPassword is the 512-byte data of SECURITY SET PASSWORD, ERASE
// UNIT and DISABLE PASSWORD: word 0 (bit 0: master password; bit 1 of
// ERASE UNIT: enhanced), then the 32-byte password.
func securityPassword(pw string, enhanced bool) []byte {
	b := make([]byte, 512)
	if enhanced {
		b[0] = 0x2
	}
	copy(b[2:34], pw)
	return b
}

// cdbName names a CDB in errors and steps.
func cdbName(cdb []byte) string {
	if len(cdb) == 0 {
		return "an empty CDB"
	}
	switch cdb[0] {
	case scsiATAPassThrough16:
		if len(cdb) == 16 {
			return fmt.Sprintf("ATA PASS-THROUGH(16) %s", ataName(cdb[14]))
		}
	case scsiSanitize:
		return fmt.Sprintf("SANITIZE service action %02xh", cdb[1]&0x1f)
	case scsiFormatUnit:
		return "FORMAT UNIT"
	case scsiRequestSense:
		return "REQUEST SENSE"
	}
	return fmt.Sprintf("SCSI opcode %02xh", cdb[0])
}

func ataName(c byte) string {
	switch c {
	case ataCmdIdentify:
		return "IDENTIFY DEVICE"
	case ataSecuritySetPassword:
		return "SECURITY SET PASSWORD"
	case ataSecurityErasePrep:
		return "SECURITY ERASE PREPARE"
	case ataSecurityEraseUnit:
		return "SECURITY ERASE UNIT"
	case ataSecurityDisablePwd:
		return "SECURITY DISABLE PASSWORD"
	}
	return fmt.Sprintf("ATA command %02xh", c)
}
