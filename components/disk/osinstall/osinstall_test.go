package osinstall

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// An earlier config is replaced.
	os.MkdirAll(filepath.Join(dir, "etc/bcd"), 0o755)
	os.WriteFile(filepath.Join(dir, ConfigPath), []byte("old"), 0o644)
	got, err := Write(root, Files{ConfigTOML: []byte("gateway = \"x\"\n"), JWK: []byte("{}\n"), Token: []byte("bcjt_a_b"),
		NodeID: "web-01", UserData: []byte("#cloud-config\n"), Format: NoCloud})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/etc/bcd/config.toml", "/etc/bcd/join-encryption.jwk", "/etc/bcd/node-id", "/etc/bcd/join-token",
		"/var/lib/cloud/seed/nocloud/user-data", "/var/lib/cloud/seed/nocloud/meta-data"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("wrote %v, want %v", got, want)
	}
	for p, m := range map[string]os.FileMode{ConfigPath: 0o600, JWKPath: 0o644, TokenPath: 0o600, NodeIDPath: 0o644} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil || st.Mode().Perm() != m {
			t.Errorf("%s: %v %v, want mode %v", p, st.Mode(), err, m)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, ConfigPath)); string(b) != "gateway = \"x\"\n" {
		t.Errorf("config.toml = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, NoCloudDir, "meta-data")); !strings.Contains(string(b), `instance-id: "web-01"`) {
		t.Errorf("meta-data = %q", b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "etc/bcd/*.bcd-tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// Ignition goes to the boot file system's ignition/config.ign.
	if _, err := Write(root, Files{UserData: []byte("{}"), Format: Ignition}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, IgnitionPath)); err != nil {
		t.Error(err)
	}
}

// An image whose /etc/bcd is a symlink out of it, or whose target is a
// symlink, makes Write fail without writing outside the root.
func TestWriteStaysInTheImage(t *testing.T) {
	outside := t.TempDir()
	for name, plant := range map[string]func(dir string){
		"directory symlink": func(dir string) {
			os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
			os.Symlink(outside, filepath.Join(dir, "etc/bcd"))
		},
		"absolute directory symlink to /": func(dir string) {
			os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
			os.Symlink("/", filepath.Join(dir, "etc/bcd"))
		},
		"file symlink": func(dir string) {
			os.MkdirAll(filepath.Join(dir, "etc/bcd"), 0o755)
			os.Symlink(filepath.Join(outside, "config.toml"), filepath.Join(dir, ConfigPath))
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			plant(dir)
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			if _, err := Write(root, Files{ConfigTOML: []byte("x")}); err == nil {
				t.Fatal("Write followed a symlink planted in the image")
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Fatalf("wrote outside the image: %v", ents)
			}
		})
	}
}

func TestWriteRefusals(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for name, f := range map[string]Files{
		"unknown format":          {UserData: []byte("x"), Format: "kickstart"},
		"nocloud without node id": {UserData: []byte("x"), Format: NoCloud},
		"node id with a newline":  {NodeID: "a\nb"},
	} {
		if _, err := Write(root, f); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
