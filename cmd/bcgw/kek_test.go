package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/gateway/kek"
)

// bcgw kek generate prints a key (or writes a new 0600 file, never over
// an existing one) and says its fingerprint on stderr, never the key;
// bcgw kek fingerprint names the same fingerprint.
func TestKEKGenerate(t *testing.T) {
	ctx := context.Background()
	code, out, errOut := runCLI(t, ctx, "", "kek", "generate")
	if code != 0 {
		t.Fatalf("generate: %d %s", code, errOut)
	}
	k, err := kek.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errOut, k.Fingerprint()) || strings.Contains(errOut, strings.TrimSpace(out)[13:]) {
		t.Errorf("stderr: %s", errOut)
	}

	p := filepath.Join(t.TempDir(), "kek")
	code, out, errOut = runCLI(t, ctx, "", "kek", "generate", "--out", p)
	if code != 0 || out != "" {
		t.Fatalf("generate --out: %d %q %s", code, out, errOut)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the file: %v %v", st, err)
	}
	before, _ := os.ReadFile(p)
	if code, _, errOut := runCLI(t, ctx, "", "kek", "generate", "--out", p); code == 0 || !strings.Contains(errOut, "exists") {
		t.Errorf("over an existing file: %d %s", code, errOut)
	}
	if after, _ := os.ReadFile(p); string(after) != string(before) {
		t.Error("an existing key file was overwritten")
	}
	k, err = kek.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI(t, ctx, "", "kek", "fingerprint", p)
	if code != 0 || strings.TrimSpace(out) != k.Fingerprint() {
		t.Errorf("fingerprint: %d %q %s", code, out, errOut)
	}
	if code, _, errOut := runCLI(t, ctx, "", "kek", "frob"); code == 0 || !strings.Contains(errOut, "usage: bcgw kek generate") {
		t.Errorf("unknown verb: %d %s", code, errOut)
	}
}

// The key-encryption key's file: the flag, else systemd's credential
// bcgw-kek when there is one, else none.
func TestKEKFile(t *testing.T) {
	creds := t.TempDir()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if got, err := kekFile("/etc/bcgw/kek", env(map[string]string{"CREDENTIALS_DIRECTORY": creds})); got != "/etc/bcgw/kek" || err != nil {
		t.Errorf("flag: %q %v", got, err)
	}
	if got, err := kekFile("", env(nil)); got != "" || err != nil {
		t.Errorf("neither: %q %v", got, err)
	}
	if got, err := kekFile("", env(map[string]string{"CREDENTIALS_DIRECTORY": creds})); got != "" || err != nil {
		t.Errorf("credentials without bcgw-kek: %q %v", got, err)
	}
	p := filepath.Join(creds, "bcgw-kek")
	if err := os.WriteFile(p, []byte("x"), 0o400); err != nil {
		t.Fatal(err)
	}
	if got, err := kekFile("", env(map[string]string{"CREDENTIALS_DIRECTORY": creds})); got != p || err != nil {
		t.Errorf("credential: %q %v", got, err)
	}
}
