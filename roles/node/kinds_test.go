package main

import (
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/dispatch/kindtable"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/config"
)

// TestKindTable: the node agent accepts exactly the kinds of kinds.txt
// (node.reboot, which the agent adds when the role wires a reboot or runs
// a fakehw build, included; a fakehw build's test kinds left out) and refuses every site
// and ramdisk kind as UNSUPPORTED.
func TestKindTable(t *testing.T) {
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(`gateway = "https://gw.example:8443"
data_dir = "`+filepath.Join(dir, "data")+`"
`), filepath.Join(dir, "config.toml"))
	if err != nil {
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
	// A fakehw build's agent adds its fake reboot.
	if m.Reboot != nil || buildinfo.FakeHW {
		kinds = append(kinds, dispatch.Kind{Name: "node.reboot"})
	}
	kindtable.Check(t, "node", kinds)
}
