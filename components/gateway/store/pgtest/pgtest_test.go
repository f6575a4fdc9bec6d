package pgtest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The binaries are found on PATH, else in Debian's versioned directory
// (the highest version), else ErrNoPostgres.
func TestBinaries(t *testing.T) {
	root := t.TempDir()
	mk := func(dir string, names ...string) string {
		d := filepath.Join(root, dir)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(d, n), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	onPath := mk("local/bin", "initdb", "postgres")
	half := mk("half/bin", "initdb")
	mk("usr/lib/postgresql/9/bin", "initdb", "postgres")
	v15 := mk("usr/lib/postgresql/15/bin", "initdb", "postgres")
	mk("usr/lib/postgresql/16/bin", "postgres") // no initdb: not usable
	tests := []struct {
		name, path, root, want string
	}{
		{"on PATH", half + string(filepath.ListSeparator) + onPath, root, onPath},
		{"Debian's, highest usable version", half, root, v15},
		{"none", half, t.TempDir(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := binaries(tt.path, tt.root)
			if tt.want == "" {
				if !errors.Is(err, ErrNoPostgres) {
					t.Fatalf("got %q %v, want ErrNoPostgres", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q %v, want %q", got, err, tt.want)
			}
		})
	}
}
