package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/cli"
)

func run(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }, Unsetenv: func(string) error { return nil }}
	code := program().Main(context.Background(), env, args)
	return code, out.String(), errOut.String()
}

// TestReleaseFlow: three release keys, a manifest of a built binary
// signed by two, verified with a threshold of two and refused with three,
// and below a floor; the keys' bytes in no output.
func TestReleaseFlow(t *testing.T) {
	dir := t.TempDir()
	var pins []string
	for _, k := range []string{"a", "b", "c"} {
		code, out, errOut := run("key", "--out", filepath.Join(dir, k+".pem"))
		if code != 0 || !strings.HasPrefix(out, "sha256/") {
			t.Fatalf("key: %d %s %s", code, out, errOut)
		}
		pins = append(pins, strings.TrimSpace(out))
		if st, _ := os.Stat(filepath.Join(dir, k+".pem")); st.Mode().Perm() != 0o600 {
			t.Errorf("key mode %v", st.Mode())
		}
	}
	if code, _, errOut := run("key", "--out", filepath.Join(dir, "a.pem")); code == 0 || !strings.Contains(errOut, "never overwritten") {
		t.Errorf("an existing key file: %d %s", code, errOut)
	}
	bin := filepath.Join(dir, "bcd-node")
	os.WriteFile(bin, []byte("a build of bcd-node"), 0o755)
	doc := filepath.Join(dir, "release.json")
	if code, _, errOut := run("make", "--version", "0.2.0", "--sequence", "2", "--expires", "48h",
		"--artifact", "node/amd64="+bin+"@https://releases.example/bcd-node", "--out", doc); code != 0 {
		t.Fatalf("make: %s", errOut)
	}
	for _, k := range []string{"a", "c"} {
		if code, _, errOut := run("sign", "--key", filepath.Join(dir, k+".pem"), "--in", doc); code != 0 {
			t.Fatalf("sign %s: %s", k, errOut)
		}
	}
	verify := func(threshold, floor string) (int, string, string) {
		args := []string{"verify", "--in", doc, "--threshold", threshold, "--floor", floor}
		for _, p := range pins {
			args = append(args, "--pin", p)
		}
		return run(args...)
	}
	if code, out, errOut := verify("2", "1"); code != 0 || !strings.Contains(out, "release 0.2.0, sequence 2") || !strings.Contains(out, "node/amd64 19 bytes") {
		t.Errorf("verify 2 of 3: %d %s %s", code, out, errOut)
	}
	if code, _, errOut := verify("3", "1"); code != 1 || !strings.Contains(errOut, "signed by 2 of the pinned keys; 3 must sign") {
		t.Errorf("verify 3 of 3: %d %s", code, errOut)
	}
	if code, _, errOut := verify("2", "3"); code != 1 || !strings.Contains(errOut, "below the release floor 3") {
		t.Errorf("verify below the floor: %d %s", code, errOut)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "a.pem"))
	for _, p := range []string{doc} {
		got, _ := os.ReadFile(p)
		if bytes.Contains(got, b[30:60]) {
			t.Error("a key's bytes are in the manifest")
		}
	}
}
