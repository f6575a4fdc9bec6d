package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/config"
)

func updateLines(rs []Result) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString(string(r.Status) + " " + r.Detail + "\n")
	}
	return b.String()
}

// TestUpdateChecks: missing pins warn; with slots in use, current must
// name its recorded binary and the entrypoint must run through current
// (a link elsewhere fails); a pending upgrade and a failed version warn.
func TestUpdateChecks(t *testing.T) {
	dir := t.TempDir()
	cfg := &config.Config{DataDir: dir}
	entry := filepath.Join(dir, "bcd")
	os.WriteFile(entry, []byte("bcd 0.1.0"), 0o755)
	got := updateLines(updateResults(cfg, entry, time.Now()))
	if !strings.Contains(got, "warn no [update] release_pins") || !strings.Contains(got, "ok no slots yet") {
		t.Errorf("no pins, no slots:\n%s", got)
	}
	cfg.Update.ReleasePins = []string{"sha256/" + strings.Repeat("A", 43) + "="}
	s := &update.Slots{Dir: update.SlotsDir(cfg)}
	if err := s.Init(entry, "0.1.0", 1); err != nil {
		t.Fatal(err)
	}
	got = updateLines(updateResults(cfg, entry, time.Now()))
	if strings.Contains(got, "fail") || strings.Contains(got, "warn") || !strings.Contains(got, "runs 0.1.0 (bcd-a), release floor 1") || !strings.Contains(got, "executes") {
		t.Errorf("healthy slots:\n%s", got)
	}
	// The package manager replaced the entrypoint: the slots still run
	// 0.1.0, and doctor says the package's binary does not run.
	os.WriteFile(entry, []byte("bcd 0.2.0 from apt"), 0o755)
	if got := updateLines(updateResults(cfg, entry, time.Now())); !strings.Contains(got, "warn the package's "+entry+" (changed ") || !strings.Contains(got, "the slots run 0.1.0") {
		t.Errorf("entrypoint replaced by the package manager:\n%s", got)
	}
	os.WriteFile(entry, []byte("bcd 0.1.0"), 0o755)
	// A link elsewhere bypasses the slots.
	link := filepath.Join(dir, "bcd-link")
	os.Symlink(entry, link)
	if got := updateLines(updateResults(cfg, link, time.Now())); !strings.Contains(got, "fail the entrypoint "+link+" is a link that does not lead to") {
		t.Errorf("entrypoint elsewhere:\n%s", got)
	}
	os.Remove(link)
	os.Symlink(filepath.Join(s.Dir, update.Current), link)
	if got := updateLines(updateResults(cfg, link, time.Now())); !strings.Contains(got, "ok the entrypoint "+link+" links to") {
		t.Errorf("entrypoint to current:\n%s", got)
	}
	// A tampered slot, a pending upgrade and a failed version.
	os.WriteFile(filepath.Join(s.Dir, update.SlotA), []byte("bcd 6.6.6"), 0o755)
	os.WriteFile(filepath.Join(s.Dir, update.UpgradeFile), []byte(`{"from":"bcd-b","to":"bcd-a","version":"0.3.0","sequence":3,"deadline":"2030-01-01T00:00:00Z"}`), 0o644)
	os.WriteFile(filepath.Join(s.Dir, update.SlotsFile), []byte(`{"slots":{"bcd-a":{"version":"0.1.0","sequence":1,"sha256":"00"}},"floor":1,"failed":["0.2.0"]}`), 0o644)
	got = updateLines(updateResults(cfg, entry, time.Date(2029, 12, 31, 23, 59, 0, 0, time.UTC)))
	for _, want := range []string{"fail " + filepath.Join(s.Dir, "current") + " names bcd-a, which is not the binary recorded", "warn an upgrade to 0.3.0 waits for its confirmation (deadline in 1m0s)", "warn release 0.2.0 failed and is not tried again (bcd update --clear-failed)"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}
