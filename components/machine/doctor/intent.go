package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/anchor"
	"github.com/better-compute/bcd/components/trust/bundle"
	"github.com/better-compute/bcd/components/trust/identity"
)

// SignedIntent checks the trust bundle held in dataDir: fail when it does
// not verify against pin, warn when it names no command-signing roots (a
// gateway, or whoever holds its serving key, could then order any
// command), ok when signed intent is enforced.
func SignedIntent(dataDir, pin string) Check {
	return Check{Name: "intent", Run: func(context.Context) Result {
		r := Result{Name: "intent"}
		h, err := bundle.Load(dataDir, pin)
		switch {
		case err != nil:
			r.Status, r.Detail = Fail, err.Error()
		case !h.Enforced():
			r.Status = Warn
			r.Detail = fmt.Sprintf("signed intent is off: trust bundle version %d names no command-signing roots, so any command or spec the gateway sends is run (bcgw trust add-root, or a bcgw with its own command key)", h.Version())
		default:
			r.Status = OK
			r.Detail = fmt.Sprintf("signed intent enforced: trust bundle version %d, %d command-signing roots", h.Version(), h.Roots().Len())
		}
		return r
	}}
}

// HelperTrust says what bcd helper binds signed intent to, read from
// root's [helper] state_dir: ok for a join record for this node signed by
// the pinned join-signing key; warn when there is none (a node joined
// before records existed: the helper binds to the node of the first signed
// section, trust on first use); fail for a record of another node or one
// whose signature fails. Only root reads the directory: as another user
// it warns and says so.
func HelperTrust(cfg *config.Config) Check {
	return Check{Name: "helper-trust", Run: func(context.Context) Result {
		r := Result{Name: "helper-trust"}
		dir := cfg.Helper.StateDirOrDefault()
		if f, err := os.Open(filepath.Join(dir, anchor.RecordFile)); errors.Is(err, fs.ErrPermission) {
			r.Status, r.Detail = Warn, "cannot read "+dir+" as this user: run bcd doctor as root to see what bcd helper binds signed intent to"
			return r
		} else if err == nil {
			f.Close()
		}
		var id struct {
			NodeID string `json:"node_id"`
		}
		if b, err := os.ReadFile(filepath.Join(cfg.DataDir, identity.IdentityFile)); err == nil {
			_ = json.Unmarshal(b, &id)
		}
		nodeID := id.NodeID
		b := anchor.Check(dir, cfg.JoinSigningKeyPin, nodeID)
		r.Detail = b.Detail
		switch b.State {
		case "ok":
			r.Status = OK
			if len(cfg.Helper.CommandRootSHA256) > 0 {
				r.Detail += fmt.Sprintf("; %d command-signing roots pinned in [helper] command_root_sha256", len(cfg.Helper.CommandRootSHA256))
			}
		case "tofu":
			r.Status = Warn
		default:
			r.Status = Fail
		}
		return r
	}}
}
