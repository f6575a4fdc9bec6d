package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDatabaseURL(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withPW := write("pw", "postgres://bcgw:s3cret-pw@db.lab/bcgw\n")
	worldReadable := write("world", "postgres://bcgw:s3cret-pw@db.lab/bcgw\n")
	if err := os.Chmod(worldReadable, 0o644); err != nil {
		t.Fatal(err)
	}
	groupReadable := write("group", "postgres://bcgw:s3cret-pw@db.lab/bcgw\n")
	if err := os.Chmod(groupReadable, 0o640); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, flag, file, want, wantErr string
	}{
		{"neither: bbolt", "", "", "", ""},
		{"URL without password", "postgres://bcgw@db.lab/bcgw", "", "postgres://bcgw@db.lab/bcgw", ""},
		{"socket URL", "postgres:///bcgw?host=/run/postgresql", "", "postgres:///bcgw?host=/run/postgresql", ""},
		{"URL with password", "postgres://bcgw:s3cret-pw@db.lab/bcgw", "", "", "carries a password"},
		{"password parameter", "postgresql://db.lab/bcgw?password=s3cret-pw", "", "", "carries a password"},
		{"key=value password", "host=db.lab password=s3cret-pw", "", "", "carries a password"},
		{"file with password", "", withPW, "postgres://bcgw:s3cret-pw@db.lab/bcgw", ""},
		{"both", "postgres:///x", withPW, "", "not both"},
		{"absent file", "", filepath.Join(dir, "absent"), "", "no such file"},
		{"empty file", "", write("empty", "\n"), "", "want one line"},
		{"two lines", "", write("two", "postgres:///a\npostgres:///b\n"), "", "want one line"},
		// The password file under the key-encryption key file's rule.
		{"world-readable file", "", worldReadable, "", "readable by group or others (mode -rw-r--r--); chmod 600 it"},
		{"group-readable file", "", groupReadable, "", "chmod 600 it"},
		{"a directory", "", dir, "", "is not a regular file"},
		{"an oversized file", "", write("big", "postgres:///"+strings.Repeat("x", 5000)), "", "over 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := databaseURL(tt.flag, tt.file)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret-pw") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q %v, want %q", got, err, tt.want)
			}
		})
	}
}
