package wipe

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// AdminCmd is the kernel's struct nvme_passthru_cmd (72 bytes), the
// argument of NVME_IOCTL_ADMIN_CMD.
type AdminCmd struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	NSID        uint32
	Cdw2        uint32
	Cdw3        uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	Cdw10       uint32
	Cdw11       uint32
	Cdw12       uint32
	Cdw13       uint32
	Cdw14       uint32
	Cdw15       uint32
	TimeoutMs   uint32
	Result      uint32
}

// NVMe admin opcodes used here.
const (
	opGetLogPage = 0x02
	opIdentify   = 0x06
	opFormatNVM  = 0x80
	opSanitize   = 0x84
)

// Secure Erase Settings of Format NVM (cdw10 bits 11:9).
const (
	sesNone   = 0
	sesUser   = 1 // user data erase
	sesCrypto = 2 // cryptographic erase
)

// Sanitize actions (cdw10 bits 2:0).
const sanactCryptoErase = 4

// logSanitizeStatus is the Sanitize Status log page.
const logSanitizeStatus = 0x81

func opName(op uint8) string {
	switch op {
	case opGetLogPage:
		return "Get Log Page"
	case opIdentify:
		return "Identify"
	case opFormatNVM:
		return "Format NVM"
	case opSanitize:
		return "Sanitize"
	}
	return fmt.Sprintf("opcode %#x", op)
}

func (c *AdminCmd) String() string {
	return fmt.Sprintf("{opcode=%#02x (%s), nsid=%#x, cdw10=%#x, data_len=%d}", c.Opcode, opName(c.Opcode), c.NSID, c.Cdw10, c.DataLen)
}

// StatusError is an NVMe completion status other than success: the
// ioctl returned it as a positive value.
type StatusError struct {
	Status uint32 // the status field as Linux returns it: SC bits 7:0, SCT 10:8, DNR bit 14
}

func (e StatusError) Error() string {
	sct, sc := (e.Status>>8)&7, e.Status&0xff
	name := "unknown status"
	switch {
	case sct == 0 && sc == 0x01:
		name = "Invalid Command Opcode"
	case sct == 0 && sc == 0x02:
		name = "Invalid Field in Command"
	case sct == 0 && sc == 0x0b:
		name = "Invalid Namespace or Format"
	case sct == 0 && sc == 0x1d:
		name = "Sanitize In Progress"
	case sct == 1 && sc == 0x0a:
		name = "Invalid Format"
	case sct == 1 && sc == 0x15:
		name = "Namespace Insufficient Capacity"
	case sct == 1 && sc == 0x23:
		name = "Sanitize Prohibited While Persistent Memory Region is Enabled"
	}
	s := fmt.Sprintf("NVMe status %#x: %s (SCT %d, SC %#02x)", e.Status, name, sct, sc)
	if e.Status&(1<<14) != 0 {
		s += ", do not retry"
	}
	return s
}

// Caps is what an NVMe controller advertises about erasing, from Identify
// Controller.
type Caps struct {
	Model, Serial, Firmware string
	// FormatNVM: OACS bit 1, the controller supports Format NVM.
	FormatNVM bool
	// FormatAllNamespaces: FNA bit 0, a format applies to every namespace.
	FormatAllNamespaces bool
	// SecureEraseAllNamespaces: FNA bit 1, a secure erase applies to every
	// namespace.
	SecureEraseAllNamespaces bool
	// CryptoEraseFormat: FNA bit 2, Format NVM supports cryptographic
	// erase (SES=2).
	CryptoEraseFormat bool
	// SanitizeCrypto, SanitizeBlock, SanitizeOverwrite: SANICAP bits 0-2.
	SanitizeCrypto, SanitizeBlock, SanitizeOverwrite bool
}

func (c Caps) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%q serial %q firmware %q:", c.Model, c.Serial, c.Firmware)
	flag := func(on bool, s string) {
		if on {
			b.WriteString(" " + s)
		}
	}
	flag(c.FormatNVM, "format")
	flag(c.FormatAllNamespaces, "format-applies-to-all-namespaces")
	flag(c.SecureEraseAllNamespaces, "secure-erase-applies-to-all-namespaces")
	flag(c.CryptoEraseFormat, "format-crypto-erase")
	flag(c.SanitizeCrypto, "sanitize-crypto")
	flag(c.SanitizeBlock, "sanitize-block")
	flag(c.SanitizeOverwrite, "sanitize-overwrite")
	return b.String()
}

// Identify Controller offsets (NVMe base specification).
const (
	idSN      = 4   // 20 bytes
	idMN      = 24  // 40 bytes
	idFR      = 64  // 8 bytes
	idOACS    = 256 // 2 bytes
	idSANICAP = 328 // 4 bytes
	idFNA     = 524 // 1 byte
)

// ParseIdentifyController reads Caps from a 4096-byte Identify Controller
// data structure.
func ParseIdentifyController(b []byte) (Caps, error) {
	if len(b) < 4096 {
		return Caps{}, fmt.Errorf("identify controller: %d bytes, want 4096", len(b))
	}
	oacs := binary.LittleEndian.Uint16(b[idOACS:])
	sanicap := binary.LittleEndian.Uint32(b[idSANICAP:])
	fna := b[idFNA]
	return Caps{
		Serial:                   ascii(b[idSN : idSN+20]),
		Model:                    ascii(b[idMN : idMN+40]),
		Firmware:                 ascii(b[idFR : idFR+8]),
		FormatNVM:                oacs&(1<<1) != 0,
		FormatAllNamespaces:      fna&(1<<0) != 0,
		SecureEraseAllNamespaces: fna&(1<<1) != 0,
		CryptoEraseFormat:        fna&(1<<2) != 0,
		SanitizeCrypto:           sanicap&(1<<0) != 0,
		SanitizeBlock:            sanicap&(1<<1) != 0,
		SanitizeOverwrite:        sanicap&(1<<2) != 0,
	}, nil
}

// ascii trims an Identify string field (space padded; NULs on some
// devices).
func ascii(b []byte) string { return strings.Trim(string(b), " \x00") }

// Namespace is what Format NVM must keep of a namespace's format.
type Namespace struct {
	LBAF uint8 // the current LBA format index (FLBAS bits 3:0, 6:5)
	MSET bool  // metadata transferred at the end of the LBA (FLBAS bit 4)
	PI   uint8 // protection information type (DPS bits 2:0)
	PIL  bool  // PI in the first bytes of metadata (DPS bit 3)
}

// ParseIdentifyNamespace reads the current format from a 4096-byte
// Identify Namespace data structure.
func ParseIdentifyNamespace(b []byte) (Namespace, error) {
	if len(b) < 4096 {
		return Namespace{}, fmt.Errorf("identify namespace: %d bytes, want 4096", len(b))
	}
	flbas, dps := b[26], b[29]
	return Namespace{
		LBAF: flbas&0x0f | (flbas>>5&3)<<4,
		MSET: flbas&(1<<4) != 0,
		PI:   dps & 7,
		PIL:  dps&(1<<3) != 0,
	}, nil
}

// formatCdw10 keeps the namespace's format and asks for ses.
func formatCdw10(ns Namespace, ses uint32) uint32 {
	v := uint32(ns.LBAF&0x0f) | uint32(ns.PI&7)<<5 | ses<<9 | uint32(ns.LBAF>>4&3)<<12
	if ns.MSET {
		v |= 1 << 4
	}
	if ns.PIL {
		v |= 1 << 8
	}
	return v
}

// Sanitize Status (log page 0x81) SSTAT values, bits 2:0.
const (
	sstatNever      = 0
	sstatDone       = 1
	sstatInProgress = 2
	sstatFailed     = 3
	sstatDoneNoDeal = 4
)
