package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch/kindtable"
	"github.com/better-compute/bcd/components/base/config"
)

// TestKindTable: the site agent, with a boot server (its most kinds),
// accepts exactly the kinds of kinds.txt and refuses every node and
// ramdisk kind as UNSUPPORTED.
func TestKindTable(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	cfg, err := config.Parse([]byte(`gateway = "https://gw.example:8443"
data_dir = "`+filepath.Join(dir, "data")+`"
[boot]
listen = "127.0.0.1:0"
url = "http://127.0.0.1:1"
`), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.JoinEncryptionJWKPath(), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := machine(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	kinds := m.Kinds
	if m.Update != nil {
		kinds = append(kinds, m.Update.Kind())
	}
	kindtable.Check(t, "site", kinds)
}
