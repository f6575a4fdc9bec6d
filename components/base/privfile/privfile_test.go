package privfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		name, path, want string
	}{
		{"private", write("ok", []byte("secret"), 0o600), ""},
		{"group-readable", write("loose", []byte("secret"), 0o640), "is readable by group or others (mode -rw-r-----); chmod 600 it"},
		{"too large", write("big", []byte(strings.Repeat("x", 17)), 0o600), "is over 16 bytes; one short line"},
		{"a directory", dir, "is not a regular file"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Read(tt.path, 16, "one short line")
			if tt.want == "" {
				if err != nil || string(b) != "secret" {
					t.Fatalf("Read = %q, %v", b, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || b != nil {
				t.Fatalf("Read = %q, %v; want an error with %q", b, err, tt.want)
			}
			if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "xxxx") {
				t.Errorf("the error shows the contents: %v", err)
			}
		})
	}
}
