package agent

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/trust/identity"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// ErrRebooted ends Run after a fakehw node.reboot: the caller starts the
// agent again (bcd node re-executes itself; bcd sim restarts that machine).
var ErrRebooted = errors.New("agent: rebooting (fakehw)")

const rebootFile = "fakehw/reboot.json"

type rebootRecord struct {
	CommandID string `json:"command_id"`
	BootID    string `json:"boot_id_before"`
}

// fakeReboot is node.reboot on a fake machine: it records the boot it
// leaves, makes a new boot id, and stops the agent with ErrRebooted. The
// journal marked it running before it acted, so after the "reboot" its
// Recover reports SUCCEEDED when the boot id changed.
func fakeReboot(dataDir, bootID string, stop func()) dispatch.Kind {
	p := filepath.Join(dataDir, rebootFile)
	return dispatch.Kind{
		Name: "node.reboot",
		Run: func(ctx context.Context, body []byte) (json.RawMessage, error) {
			b, _ := json.Marshal(rebootRecord{CommandID: dispatch.CommandID(ctx), BootID: bootID})
			if err := identity.WriteFileAtomic(p, b, 0o600); err != nil {
				return nil, err
			}
			if err := identity.WriteFileAtomic(filepath.Join(dataDir, "fakehw", "boot_id"), []byte(hostinfo.NewBootID()+"\n"), 0o600); err != nil {
				return nil, err
			}
			stop()
			<-ctx.Done()
			return nil, ctx.Err()
		},
		Recover: func(e *journal.Entry) *bcdv1.CommandResult {
			var rec rebootRecord
			b, err := os.ReadFile(p)
			if err != nil || json.Unmarshal(b, &rec) != nil || rec.CommandID != e.ID {
				return nil
			}
			now, err := hostinfo.BootID(dataDir)
			if err != nil || now == rec.BootID {
				return &bcdv1.CommandResult{Status: dispatch.Failed, Error: "the machine did not reboot (same boot id)"}
			}
			out, _ := json.Marshal(map[string]string{"boot_id_before": rec.BootID, "boot_id_after": now})
			return &bcdv1.CommandResult{Status: dispatch.Succeeded, Output: out, StartedUnixMs: e.StartedAt.UnixMilli()}
		},
	}
}
