package initramfs

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

// TestModuleFirmware reads the firmware list of a real module of the
// build machine's kernel (tg3 asks for the tigon files).
func TestModuleFirmware(t *testing.T) {
	mods, _ := filepath.Glob("/lib/modules/*/kernel/drivers/net/ethernet/broadcom/tg3.ko*")
	if len(mods) == 0 {
		testenv.Skip(t, "no kernel module tree with tg3 (apt-get install linux-image-amd64)")
	}
	fw, err := ModuleFirmware(mods[0])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(fw, "tigon/tg3.bin") {
		t.Errorf("tg3 asks for %v", fw)
	}
	if _, err := ModuleFirmware("firmware_test.go"); err == nil {
		t.Error("a file that is not ELF gave no error")
	}
}
