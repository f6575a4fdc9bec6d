// Package hostinfo reads the few facts about this machine that joining and
// the session need: boot id, hostname, machine id, product UUID. A fakehw
// build keeps its boot id in the data directory instead, so a simulated
// machine "reboots" when that file changes.
package hostinfo

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/buildinfo"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// BootID returns this boot's id: the kernel's, or in a fakehw build the one
// kept in dataDir/fakehw/boot_id (made on first use).
func BootID(dataDir string) (string, error) {
	if buildinfo.FakeHW {
		return fakeBootID(filepath.Join(dataDir, "fakehw"))
	}
	return readTrim("/proc/sys/kernel/random/boot_id")
}

func fakeBootID(dir string) (string, error) {
	p := filepath.Join(dir, "boot_id")
	if id, err := readTrim(p); err == nil && id != "" {
		return id, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	id := NewBootID()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if err := atomicfile.Write(p, []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	return id, nil
}

// NewBootID makes a random boot id in the kernel's format.
func NewBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func readTrim(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Claims gathers what a join reports about the machine. Unreadable facts
// (the product UUID needs root) are left empty.
func Claims(dataDir string) *bcdv1.HardwareClaims {
	c := &bcdv1.HardwareClaims{Arch: runtime.GOARCH, Os: runtime.GOOS}
	c.Hostname, _ = os.Hostname()
	c.MachineId, _ = readTrim("/etc/machine-id")
	c.ProductUuid, _ = readTrim("/sys/class/dmi/id/product_uuid")
	c.BootId, _ = BootID(dataDir)
	return c
}
