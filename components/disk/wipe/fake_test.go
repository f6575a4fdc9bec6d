package wipe

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// fakeDevice is a disk in memory. With nsid set it is an NVMe namespace
// whose controller answers Identify, Format NVM, Sanitize and the
// Sanitize Status log from ctrl.
type fakeDevice struct {
	mu         sync.Mutex
	data       []byte
	kind       string
	nsid       uint32
	parts      []Span
	secDiscard error // what BLKSECDISCARD returns; nil erases
	dropWrites bool  // writes succeed and change nothing
	ctrl       fakeController
	admin      []AdminCmd
	writes     int
	ata        *fakeATA // a SATA drive: it takes ATA PASS-THROUGH
	sas        *fakeSAS // a SAS disk
}

type fakeController struct {
	caps     Caps
	lbaf     uint8
	sanitize bool // the controller implements the Sanitize opcode
	lie      bool // commands succeed and erase nothing
	// anySES accepts every Secure Erase Setting whatever FNA says, as
	// QEMU's NVMe does.
	anySES bool
	// sanitizePolls is how many Sanitize Status reads say "in progress".
	sanitizePolls int
	sanitizing    int
}

func newFake(size int64, nsid uint32) *fakeDevice {
	kind := "block device"
	if nsid != 0 {
		kind = fmt.Sprintf("NVMe namespace %d", nsid)
	}
	return &fakeDevice{data: make([]byte, size), kind: kind, nsid: nsid}
}

func (f *fakeDevice) Path() string           { return "/dev/fake" }
func (f *fakeDevice) Size() int64            { return int64(len(f.data)) }
func (f *fakeDevice) Kind() string           { return f.kind }
func (f *fakeDevice) ReadBackMethod() string { return "fake medium" }
func (f *fakeDevice) Sync() error            { return nil }
func (f *fakeDevice) NSID() uint32           { return f.nsid }
func (f *fakeDevice) Close() error           { return nil }
func (f *fakeDevice) RereadPartitions() error {
	return nil
}
func (f *fakeDevice) Partitions() ([]Span, error) { return f.parts, nil }

func (f *fakeDevice) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	if off < 0 || off+int64(len(p)) > int64(len(f.data)) {
		return 0, fmt.Errorf("pwrite(/dev/fake, %d bytes, %d) = no space left on device", len(p), off)
	}
	if !f.dropWrites {
		copy(f.data[off:], p)
	}
	return len(p), nil
}

func (f *fakeDevice) ReadBack(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copy(p, f.data[off:]), nil
}

func (f *fakeDevice) SecureDiscard(off, n int64) error {
	if f.secDiscard != nil {
		return fmt.Errorf("ioctl(/dev/fake, BLKSECDISCARD, [%d, %d]) = %w", off, n, f.secDiscard)
	}
	clear(f.data[off : off+n])
	return nil
}

func (f *fakeDevice) erase() {
	if !f.ctrl.lie {
		clear(f.data)
	}
}

func (f *fakeDevice) Admin(cmd *AdminCmd, data []byte) error {
	f.admin = append(f.admin, *cmd)
	status := func(s uint32) error {
		return fmt.Errorf("ioctl(/dev/fake, NVME_IOCTL_ADMIN_CMD, %v) = %w", cmd, StatusError{Status: s})
	}
	c := &f.ctrl
	switch cmd.Opcode {
	case opIdentify:
		clear(data)
		switch cmd.Cdw10 {
		case 1:
			copy(data[idSN:idSN+20], fmt.Sprintf("%-20s", "FAKE0001"))
			copy(data[idMN:idMN+40], fmt.Sprintf("%-40s", "Fake NVMe Ctrl"))
			copy(data[idFR:idFR+8], "1.0     ")
			var oacs uint16
			if c.caps.FormatNVM {
				oacs |= 1 << 1
			}
			binary.LittleEndian.PutUint16(data[idOACS:], oacs)
			var sanicap uint32
			if c.caps.SanitizeCrypto {
				sanicap |= 1
			}
			binary.LittleEndian.PutUint32(data[idSANICAP:], sanicap)
			var fna byte
			if c.caps.FormatAllNamespaces {
				fna |= 1
			}
			if c.caps.CryptoEraseFormat {
				fna |= 4
			}
			data[idFNA] = fna
		case 0:
			data[26] = c.lbaf
		}
		return nil
	case opFormatNVM:
		if !c.caps.FormatNVM {
			return status(0x4001) // Invalid Command Opcode, DNR
		}
		ses := cmd.Cdw10 >> 9 & 7
		if cmd.Cdw10&0xf != uint32(c.lbaf) || ses > 2 || (ses == 2 && !c.caps.CryptoEraseFormat && !c.anySES) {
			return status(0x4002) // Invalid Field in Command
		}
		f.erase()
		return nil
	case opSanitize:
		if !c.sanitize {
			return status(0x4001)
		}
		if cmd.Cdw10&7 != sanactCryptoErase {
			return status(0x4002)
		}
		c.sanitizing = c.sanitizePolls
		f.erase()
		return nil
	case opGetLogPage:
		if cmd.Cdw10&0xff != logSanitizeStatus {
			return status(0x4002)
		}
		clear(data)
		sstat := uint16(sstatDone)
		if c.sanitizing > 0 {
			c.sanitizing--
			sstat = sstatInProgress
		}
		binary.LittleEndian.PutUint16(data[2:], sstat)
		return nil
	}
	return status(0x4001)
}
