// Package seed writes an instance's cloud-init NoCloud seed: an ISO9660
// volume labelled cidata holding meta-data (the instance id and its
// hostname, rendered here), user-data (the allocation's, as given) and,
// when the instance's NICs have addresses, network-config (rendered here
// from them, network.go). The volume is built in memory by this
// package (no tool, no staging directory where user data could linger)
// and written 0640 through a temporary file. User data is a tenant's
// secret: it is never logged and never put in an error.
// docs/instances.md describes the seed.
package seed

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
)

// Label is the volume identifier cloud-init's NoCloud looks for.
const Label = "cidata"

// Bounds of what a seed carries.
const MaxUserData = 1 << 20

// sector is ISO9660's logical block.
const sector = 2048

// Seed is what goes into an instance's seed.
type Seed struct {
	// InstanceID and Hostname render meta-data: [A-Za-z0-9_-], at most
	// 64 bytes, and a DNS label ([a-z0-9-], at most 63); an empty
	// Hostname is the instance id, lowercased, '_' as '-'.
	InstanceID string
	Hostname   string
	// UserData is written as given (empty: an empty user-data, which
	// NoCloud still requires).
	UserData []byte
	// Interfaces, when not empty, render network-config (NetworkConfig).
	Interfaces []Interface
}

// MetaData renders meta-data: instance-id and local-hostname.
func (s Seed) MetaData() ([]byte, error) {
	if !idLike(s.InstanceID, 64, "_-", true) {
		return nil, fmt.Errorf("seed: instance id %q is not [A-Za-z0-9_-], 1 to 64", s.InstanceID)
	}
	if s.Hostname == "" {
		s.Hostname = strings.Trim(strings.ReplaceAll(strings.ToLower(s.InstanceID), "_", "-"), "-")
	}
	if !idLike(s.Hostname, 63, "-", false) || s.Hostname[0] == '-' || s.Hostname[len(s.Hostname)-1] == '-' {
		return nil, fmt.Errorf("seed: hostname %q is not a DNS label", s.Hostname)
	}
	return []byte("instance-id: " + s.InstanceID + "\nlocal-hostname: " + s.Hostname + "\n"), nil
}

// idLike: 1 to max bytes of lowercase letters, digits, extra and, with
// upper, uppercase letters.
func idLike(s string, max int, extra string, upper bool) bool {
	return len(s) >= 1 && len(s) <= max && !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || upper && 'A' <= r && r <= 'Z' || strings.ContainsRune(extra, r))
	})
}

// file is one file of the volume's root directory.
type file struct {
	name string
	data []byte
	lba  uint32
}

// Build returns the seed volume's bytes.
func Build(s Seed) ([]byte, error) {
	meta, err := s.MetaData()
	if err != nil {
		return nil, err
	}
	if len(s.UserData) > MaxUserData {
		return nil, fmt.Errorf("seed: user data is %d bytes; at most %d", len(s.UserData), MaxUserData)
	}
	var network []byte
	if len(s.Interfaces) > 0 {
		if network, err = NetworkConfig(s.Interfaces); err != nil {
			return nil, err
		}
	}
	// Names sorted, as ISO9660 wants them. Without Rock Ridge, Linux
	// shows them lowercased, without their ";1" version.
	files := []file{{name: "meta-data;1", data: meta}}
	if len(network) > 0 {
		files = append(files, file{name: "network-config;1", data: network})
	}
	files = append(files, file{name: "user-data;1", data: s.UserData})

	// Layout: 16 system sectors, the primary volume descriptor (16), the
	// terminator (17), the little- and big-endian path tables (18, 19),
	// the root directory (20), then each file's data.
	const rootLBA = 20
	next := uint32(rootLBA + 1)
	for i := range files {
		if n := sectors(len(files[i].data)); n > 0 {
			files[i].lba = next
			next += n
		}
	}
	img := make([]byte, int(next)*sector)

	root := img[rootLBA*sector : (rootLBA+1)*sector]
	off := 0
	off += record(root[off:], rootLBA, sector, true, "\x00")
	off += record(root[off:], rootLBA, sector, true, "\x01")
	for _, f := range files {
		off += record(root[off:], f.lba, len(f.data), false, f.name)
		copy(img[int(f.lba)*sector:], f.data)
	}

	pvd := img[16*sector : 17*sector]
	pvd[0] = 1
	copy(pvd[1:], "CD001")
	pvd[6] = 1
	pad(pvd[8:40], "")
	pad(pvd[40:72], Label)
	both32(pvd[80:], next)
	both16(pvd[120:], 1)
	both16(pvd[124:], 1)
	both16(pvd[128:], sector)
	both32(pvd[132:], 10) // one path table record of 10 bytes
	binary.LittleEndian.PutUint32(pvd[140:], 18)
	binary.BigEndian.PutUint32(pvd[148:], 19)
	record(pvd[156:190], rootLBA, sector, true, "\x00")
	pad(pvd[190:813], "")
	for _, at := range []int{813, 830, 847, 864} { // dates: not specified
		pad(pvd[at:at+16], "0000000000000000")
	}
	pvd[881] = 1

	term := img[17*sector:]
	term[0] = 255
	copy(term[1:], "CD001")
	term[6] = 1

	// The path tables: the root alone (identifier 0, parent 1).
	lpt, mpt := img[18*sector:], img[19*sector:]
	lpt[0], mpt[0] = 1, 1
	binary.LittleEndian.PutUint32(lpt[2:], rootLBA)
	binary.BigEndian.PutUint32(mpt[2:], rootLBA)
	binary.LittleEndian.PutUint16(lpt[6:], 1)
	binary.BigEndian.PutUint16(mpt[6:], 1)
	return img, nil
}

// WriteFile builds the seed and writes it to path, 0640, replacing what
// was there atomically (QEMU reads it through the group).
func WriteFile(path string, s Seed) error {
	b, err := Build(s)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o640); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

func sectors(n int) uint32 { return uint32((n + sector - 1) / sector) }

// record writes a directory record for name at b and returns its length.
func record(b []byte, lba uint32, size int, dir bool, name string) int {
	n := 33 + len(name)
	if n%2 == 1 {
		n++
	}
	b[0] = byte(n)
	both32(b[2:], lba)
	both32(b[10:], uint32(size))
	copy(b[18:25], []byte{70, 1, 1, 0, 0, 0, 0}) // 1970-01-01 00:00 UTC
	if dir {
		b[25] = 2
	}
	both16(b[28:], 1)
	b[32] = byte(len(name))
	copy(b[33:], name)
	return n
}

// pad fills b with s and then spaces.
func pad(b []byte, s string) {
	n := copy(b, s)
	for i := n; i < len(b); i++ {
		b[i] = ' '
	}
}

func both16(b []byte, v uint16) {
	binary.LittleEndian.PutUint16(b, v)
	binary.BigEndian.PutUint16(b[2:], v)
}

func both32(b []byte, v uint32) {
	binary.LittleEndian.PutUint32(b, v)
	binary.BigEndian.PutUint32(b[4:], v)
}
