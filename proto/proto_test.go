package proto_test

import (
	"bytes"
	"github.com/better-compute/bcd/components/base/testenv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestGeneratedIsCurrent(t *testing.T) {
	testenv.NeedTool(t, "protoc", "protobuf-compiler")
	out := t.TempDir()
	cmd := exec.Command("../build/proto.sh", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build/proto.sh: %v\n%s", err, b)
	}
	seen := map[string]bool{}
	err := filepath.WalkDir(out, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(out, p)
		seen[rel] = true
		want, _ := os.ReadFile(p)
		got, err := os.ReadFile(filepath.Join("gen", rel))
		if err != nil {
			t.Errorf("proto/gen/%s is missing: run make proto", rel)
			return nil
		}
		if !bytes.Equal(got, want) {
			t.Errorf("proto/gen/%s is stale: run make proto and commit it", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = filepath.WalkDir("gen", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel("gen", p)
			if !seen[rel] {
				t.Errorf("proto/gen/%s is not generated from any .proto: remove it", rel)
			}
		}
		return nil
	})
}
