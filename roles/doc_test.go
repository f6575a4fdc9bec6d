package roles_test

import (
	"os/exec"
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
