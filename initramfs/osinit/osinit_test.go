package osinit

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestRootDevice(t *testing.T) {
	for in, want := range map[string]string{
		"console=ttyS0 bcos.root=/dev/nvme0n1p2 panic=-1": "/dev/nvme0n1p2",
		"console=ttyS0":               DefaultRoot,
		"bcos.root=sysroot":           DefaultRoot,
		"bcos.root=/dev/sda1 quiet\n": "/dev/sda1",
	} {
		if got := RootDevice(in); got != want {
			t.Errorf("RootDevice(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSteps(t *testing.T) {
	etc := t.TempDir()
	if _, err := Steps(etc); err == nil {
		t.Fatal("steps without a config.toml")
	}
	cfg := filepath.Join(etc, "config.toml")
	os.WriteFile(cfg, []byte("x"), 0o600)
	got, err := Steps(etc)
	if err != nil || !reflect.DeepEqual(got, [][]string{{"join", "--config", cfg}, {"node", "--config", cfg}}) {
		t.Fatalf("without a node id: %v %v", got, err)
	}
	os.WriteFile(filepath.Join(etc, "node-id"), []byte("web-01\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "join-token"), []byte("t"), 0o600)
	got, err = Steps(etc)
	want := [][]string{{"join", "--config", cfg, "--node-id", "web-01", "--token-file", filepath.Join(etc, "join-token")}, {"node", "--config", cfg}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("provisioned: %v %v", got, err)
	}
	os.WriteFile(filepath.Join(etc, "node-id"), []byte("a b\n"), 0o644)
	if _, err := Steps(etc); err == nil {
		t.Fatal("a node id with a space accepted")
	}
}
