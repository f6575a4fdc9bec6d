package roles_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestEveryPackageHasDoc: each package says what it is for.
func TestEveryPackageHasDoc(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{.Doc}}", "./...")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, doc, _ := strings.Cut(line, "\t")
		if strings.Contains(path, "/proto/gen/") {
			continue // generated
		}
		if strings.TrimSpace(doc) == "" {
			t.Errorf("package %s has no doc comment", path)
		}
	}
}

// TestGofmt: every Go file but the generated ones is gofmt-clean.
func TestGofmt(t *testing.T) {
	gofmt, err := exec.LookPath("gofmt")
	if err != nil {
		gofmt = filepath.Join(runtime.GOROOT(), "bin", "gofmt")
	}
	out, err := exec.Command(gofmt, "-l", "../components", "../cmd", "../roles", "../e2e", "../initramfs", "../images", "../qemu-tests", "../packaging-tests").CombinedOutput()
	if err != nil {
		t.Fatalf("gofmt: %v\n%s", err, out)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		t.Fatalf("gofmt would change:\n%s", s)
	}
}
