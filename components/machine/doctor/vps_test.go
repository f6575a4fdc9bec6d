package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNft(t *testing.T) {
	for _, c := range []struct {
		name   string
		tools  []string
		status Status
		detail string
	}{
		{"runtime without nft", []string{"usr/bin/virsh"}, Fail, "no anti-spoofing or network policies"},
		{"cloud-hypervisor without nft", []string{"usr/bin/cloud-hypervisor"}, Fail, "cloud-hypervisor"},
		{"runtime with nft", []string{"usr/bin/virsh", "usr/sbin/nft"}, OK, "/usr/sbin/nft"},
		{"no runtime, no nft", nil, OK, "not needed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for _, tool := range c.tools {
				p := filepath.Join(root, tool)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			r := nft(root).Run(context.Background())
			if r.Status != c.status || !strings.Contains(r.Detail, c.detail) {
				t.Fatalf("%s: %s, want %s %q", r.Status, r.Detail, c.status, c.detail)
			}
		})
	}
}

func TestVPS(t *testing.T) {
	write := func(t *testing.T, root, name, content string, mode os.FileMode) {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name   string
		files  map[string]string
		check  func(root string) Check
		status Status
		detail string
	}{
		{"runtime", map[string]string{"usr/bin/virsh": "", "usr/sbin/libvirtd": ""}, vpsRuntime, OK, "libvirt-kvm (/usr/bin/virsh, /usr/sbin/libvirtd)"},
		{"no runtime", nil, vpsRuntime, Warn, "no instance runtime"},
		{"qemu-img missing", map[string]string{"usr/bin/virsh": ""}, func(r string) Check { return vpsTool(r, "qemu-img", "qemu-utils", "x") }, Warn, "qemu-utils"},
		{"qemu-img not needed", nil, func(r string) Check { return vpsTool(r, "qemu-img", "qemu-utils", "x") }, OK, "not needed"},
		{"node in libvirt", map[string]string{"etc/group": "root:x:0:\nlibvirt:x:120:alice,bcd\n"}, func(r string) Check { return libvirtGroup(r, "bcd") }, Fail, "gpasswd -d bcd libvirt"},
		{"node not in libvirt", map[string]string{"etc/group": "libvirt:x:120:alice,bcdx\n"}, func(r string) Check { return libvirtGroup(r, "bcd") }, OK, "not in the libvirt group"},
		{"dynamic ownership off", map[string]string{"etc/libvirt/qemu.conf": "#dynamic_ownership = 1\ndynamic_ownership = 0\n"}, dynamicOwnership, OK, "= 0"},
		{"dynamic ownership on", map[string]string{"etc/libvirt/qemu.conf": "dynamic_ownership = 1\n"}, dynamicOwnership, Warn, "chowns"},
		{"dynamic ownership default", map[string]string{"etc/libvirt/qemu.conf": "#dynamic_ownership = 0\n"}, dynamicOwnership, Warn, "default is 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for name, content := range c.files {
				write(t, root, name, content, 0o755)
			}
			r := c.check(root).Run(context.Background())
			if r.Status != c.status || !strings.Contains(r.Detail, c.detail) {
				t.Fatalf("%s: %s, want %s %q", r.Status, r.Detail, c.status, c.detail)
			}
		})
	}
}
