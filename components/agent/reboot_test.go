package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/journal"
)

// TestHostReboot: node.reboot records the boot it leaves before asking
// for the reboot, waits to be stopped, and reports from Recover after the
// restart: FAILED in the same boot. A refused reboot fails at once and
// leaves no record.
func TestHostReboot(t *testing.T) {
	dir := t.TempDir()
	now, err := hostinfo.BootID(dir)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	k := hostReboot(dir, now, func(_ context.Context, reason string) error {
		asked = append(asked, reason)
		return nil
	})
	ctx, cancel := context.WithCancel(dispatch.WithCommandID(context.Background(), "cmd_r1"))
	done := make(chan error, 1)
	go func() { _, err := k.Run(ctx, []byte(`{"reason":"kernel update"}`)); done <- err }()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("node.reboot returned before it was stopped: %v", err)
	default:
	}
	cancel() // the shutdown stops bcd
	<-done
	if strings.Join(asked, ",") != "kernel update" {
		t.Errorf("reboot asked with %q", asked)
	}
	if _, err := os.Stat(filepath.Join(dir, hostRebootFile)); err != nil {
		t.Fatalf("no record of the boot it left: %v", err)
	}
	// bcd starts again in the same boot: the reboot did not happen.
	r := k.Recover(&journal.Entry{ID: "cmd_r1"})
	if r == nil || r.Status != dispatch.Failed || !strings.Contains(r.Error, "did not reboot") {
		t.Errorf("Recover in the same boot = %+v", r)
	}
	if r := k.Recover(&journal.Entry{ID: "cmd_other"}); r != nil {
		t.Errorf("Recover of another command = %+v", r)
	}
	// A refused reboot fails now, without a record.
	os.Remove(filepath.Join(dir, hostRebootFile))
	k = hostReboot(dir, now, func(context.Context, string) error { return errors.New("the helper refused") })
	if _, err := k.Run(dispatch.WithCommandID(context.Background(), "cmd_r2"), nil); err == nil || !strings.Contains(err.Error(), "the helper refused") {
		t.Errorf("a refused reboot: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, hostRebootFile)); !os.IsNotExist(err) {
		t.Errorf("a refused reboot left its record: %v", err)
	}
	if _, err := k.Run(dispatch.WithCommandID(context.Background(), "cmd_r3"), []byte(`{"why":1}`)); err == nil {
		t.Error("a body with an unknown field was taken")
	}
}
