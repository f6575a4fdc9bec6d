package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestIPXEScript(t *testing.T) {
	s := IPXEScript
	for _, want := range []string{"#!ipxe\n", "\nkernel vmlinuz initrd=initramfs.cpio.zst ", "console=ttyS0,115200n8", "panic=-1", " ${bc-params}\n", "\ninitrd initramfs.cpio.zst\n", "\nboot\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("the iPXE script lacks %q:\n%s", want, s)
		}
	}
}

func TestDigest(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	os.WriteFile(p, []byte("abc"), 0o644)
	sum, n, err := digest(p)
	if err != nil || n != 3 || sum != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("digest = %s, %d, %v", sum, n, err)
	}
}
