package update

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
)

func TestCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	os.WriteFile(cfg, []byte("data_dir = \""+dir+"/data\"\n[update]\nrelease_pins = [\"sha256/"+strings.Repeat("A", 43)+"=\", \"sha256/"+strings.Repeat("B", 42)+"A=\"]\nrelease_threshold = 2\n"), 0o600)
	run := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Command().Run(context.Background(), &cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(string) string { return "" }}, append([]string{"--config", cfg}, args...))
		return code, out.String(), errOut.String()
	}
	if code, out, _ := run(); code != 0 || !strings.Contains(out, "2 of 2 release keys must sign") || !strings.Contains(out, "slots: none yet in "+dir+"/data/bin") {
		t.Errorf("before any update: %d %s", code, out)
	}
	c := &clock{t: time.Now()}
	s := &Slots{Dir: filepath.Join(dir, "data", "bin"), Now: c.now}
	bin := filepath.Join(dir, "bcd")
	os.WriteFile(bin, []byte("bcd 0.1.0"), 0o755)
	if err := s.Init(bin, "0.1.0", 1); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run("--pending"); code != 1 || !strings.Contains(errOut, "no upgrade pending") {
		t.Errorf("--pending with none: %d %s", code, errOut)
	}
	upgrade(t, s, "0.2.0", 2)
	if code, out, _ := run("--pending"); code != 0 || !strings.Contains(out, "pending: 0.2.0 in bcd-b") {
		t.Errorf("--pending: %d %s", code, out)
	}
	if code, _, errOut := run("--rollback"); code != 0 || !strings.Contains(errOut, "rolled back 0.2.0 and recorded it failed") {
		t.Errorf("--rollback: %d %s", code, errOut)
	}
	if code, _, errOut := run("--rollback"); code != 0 || !strings.Contains(errOut, "nothing rolled back") {
		t.Errorf("--rollback with none: %d %s", code, errOut)
	}
	code, out, _ := run()
	if code != 0 || !strings.Contains(out, "current bcd-a, release floor 1") || !strings.Contains(out, "bcd-b: 0.2.0 (sequence 2") || !strings.Contains(out, "failed: 0.2.0") {
		t.Errorf("after a rollback: %d %s", code, out)
	}
	if code, _, errOut := run("--clear-failed"); code != 0 || !strings.Contains(errOut, "cleared 1 failed versions (0.2.0)") {
		t.Errorf("--clear-failed: %d %s", code, errOut)
	}
	if code, out, _ := run("--json"); code != 0 || strings.Contains(out, `"failed"`) || !strings.Contains(out, `"floor": 1`) {
		t.Errorf("--json: %s", out)
	}
}
