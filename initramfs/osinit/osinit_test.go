package osinit

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
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

// TestSteps: the commands the init runs for each set of files the deploy
// (or the test) left in etc/bcd.
func TestSteps(t *testing.T) {
	type file struct{ name, body string }
	join := func(etc string, extra ...string) []string {
		return append([]string{"join", "--config", filepath.Join(etc, "config.toml")}, extra...)
	}
	node := func(etc string) []string { return []string{"node", "--config", filepath.Join(etc, "config.toml")} }
	for _, tc := range []struct {
		name  string
		files []file
		dirs  []string // made as directories
		want  func(etc string) [][]string
		err   string // a substring of the error; "" when none is expected
	}{
		{name: "no config.toml", err: "no configuration"},
		{name: "config only: joins if it already has", files: []file{{"config.toml", "x"}},
			want: func(etc string) [][]string { return [][]string{join(etc), node(etc)} }},
		{name: "provisioned node id and token", files: []file{{"config.toml", "x"}, {"node-id", "web-01\n"}, {"join-token", "t"}},
			want: func(etc string) [][]string {
				return [][]string{join(etc, "--node-id", "web-01", "--token-file", filepath.Join(etc, "join-token")), node(etc)}
			}},
		{name: "provisioned node id, token already spent", files: []file{{"config.toml", "x"}, {"node-id", "web-01"}},
			want: func(etc string) [][]string { return [][]string{join(etc, "--node-id", "web-01"), node(etc)} }},
		{name: "a node id with a space", files: []file{{"config.toml", "x"}, {"node-id", "a b\n"}}, err: "not a node id"},
		{name: "attestor tpm", files: []file{{"config.toml", "x"}, {"attestor", "tpm"}},
			want: func(etc string) [][]string { return [][]string{join(etc, "--attestor", "tpm"), node(etc)} }},
		{name: "attestor tpm with a newline and spaces", files: []file{{"config.toml", "x"}, {"attestor", " tpm\n"}},
			want: func(etc string) [][]string { return [][]string{join(etc, "--attestor", "tpm"), node(etc)} }},
		{name: "attestor tpm takes no token file", files: []file{{"config.toml", "x"}, {"attestor", "tpm\n"}, {"join-token", "t"}},
			want: func(etc string) [][]string { return [][]string{join(etc, "--attestor", "tpm"), node(etc)} }},
		{name: "attestor tpm and a node id", files: []file{{"config.toml", "x"}, {"attestor", "tpm\n"}, {"node-id", "web-01"}}, err: "keep one of them"},
		{name: "attestor TPM (case matters)", files: []file{{"config.toml", "x"}, {"attestor", "TPM\n"}}, err: `says "TPM"`},
		{name: "attestor join-token", files: []file{{"config.toml", "x"}, {"attestor", "join-token"}}, err: "the only attestor known is tpm"},
		{name: "attestor provisioned", files: []file{{"config.toml", "x"}, {"attestor", "provisioned"}, {"node-id", "web-01"}}, err: "the only attestor known is tpm"},
		{name: "attestor empty", files: []file{{"config.toml", "x"}, {"attestor", "\n"}}, err: "is empty"},
		{name: "attestor two words", files: []file{{"config.toml", "x"}, {"attestor", "tpm tpm"}}, err: "does not hold one word"},
		{name: "attestor a directory", files: []file{{"config.toml", "x"}}, dirs: []string{"attestor"}, err: "etc/bcd/attestor"},
		{name: "attestor not read: config.toml missing first", files: []file{{"attestor", "bogus"}}, err: "no configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			etc := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(etc, f.name), []byte(f.body), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range tc.dirs {
				if err := os.Mkdir(filepath.Join(etc, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			got, err := Steps(etc)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Steps = %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Steps: %v", err)
			}
			if want := tc.want(etc); !reflect.DeepEqual(got, want) {
				t.Fatalf("Steps = %q, want %q", got, want)
			}
		})
	}
}
