package dcgm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiagDCGM(t *testing.T) {
	if _, err := Kind("/nonexistent/dcgmi").Run(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("without dcgmi: %v", err)
	}
	fake := filepath.Join(t.TempDir(), "dcgmi")
	os.WriteFile(fake, []byte("#!/bin/sh\necho '{\"DCGM GPU Diagnostic\":{\"test_categories\":[]}}'\n[ \"$3\" = 2 ] && exit 226\nexit 0\n"), 0o755)
	out, err := Kind(fake).Run(context.Background(), []byte(`{"level":1}`))
	if err != nil || !strings.Contains(string(out), "DCGM GPU Diagnostic") {
		t.Fatalf("level 1: %v %s", err, out)
	}
	if _, err := Kind(fake).Run(context.Background(), []byte(`{"level":2}`)); err == nil {
		t.Fatal("a failing diag succeeded")
	}
	for _, bad := range []string{`{"level":9}`, `{"x":1}`} {
		if _, err := Kind(fake).Run(context.Background(), []byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
