package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// ErrRestart ends Run after a self-update swapped the binary slots: the
// caller executes the new binary (update.Agent, daemon.upgrade).
var ErrRestart = errors.New("agent: restarting into the new release")

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
	return rebootKind(dataDir, bootID, filepath.Join(dataDir, rebootFile), func(context.Context, string) error {
		if err := identity.WriteFileAtomic(filepath.Join(dataDir, "fakehw", "boot_id"), []byte(hostinfo.NewBootID()+"\n"), 0o600); err != nil {
			return err
		}
		stop()
		return nil
	})
}

// hostRebootFile records the boot a host's node.reboot leaves.
const hostRebootFile = "reboot.json"

// hostReboot is node.reboot on a host: it records the boot it leaves,
// asks the host to reboot (reboot: systemctl reboot as root, the
// helper's reboot unprivileged), and waits for the shutdown to stop it.
// The command is self-terminating: its result comes from Recover after
// the restart, SUCCEEDED when the boot id changed, FAILED when bcd
// started again in the same boot.
func hostReboot(dataDir, bootID string, reboot func(ctx context.Context, reason string) error) dispatch.Kind {
	return rebootKind(dataDir, bootID, filepath.Join(dataDir, hostRebootFile), reboot)
}

// rebootBody is node.reboot's body.
type rebootBody struct {
	Reason string `json:"reason,omitempty"`
}

// rebootKind records {command, boot id} in p, then runs do and waits.
func rebootKind(dataDir, bootID, p string, do func(ctx context.Context, reason string) error) dispatch.Kind {
	return dispatch.Kind{
		Name: "node.reboot",
		Run: func(ctx context.Context, body []byte) (json.RawMessage, error) {
			var rb rebootBody
			if len(body) > 0 {
				if err := dispatch.DecodeBody(body, &rb); err != nil {
					return nil, fmt.Errorf("node.reboot: %w", err)
				}
			}
			if rb.Reason == "" {
				rb.Reason = "node.reboot " + dispatch.CommandID(ctx)
			}
			b, _ := json.Marshal(rebootRecord{CommandID: dispatch.CommandID(ctx), BootID: bootID})
			if err := identity.WriteFileAtomic(p, b, 0o600); err != nil {
				return nil, err
			}
			if err := do(ctx, rb.Reason); err != nil {
				os.Remove(p)
				return nil, fmt.Errorf("node.reboot: %w", err)
			}
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
