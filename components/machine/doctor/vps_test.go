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
