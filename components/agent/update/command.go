package update

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// Status is what `bcd update` shows.
type Status struct {
	SlotsDir    string          `json:"slots_dir"`
	Pins        int             `json:"release_pins"`
	Threshold   int             `json:"release_threshold"`
	Initialized bool            `json:"initialized"`
	Current     string          `json:"current,omitempty"`
	Slots       map[string]Slot `json:"slots,omitempty"`
	Floor       uint64          `json:"floor"`
	Pending     *Upgrade        `json:"pending,omitempty"`
	Failed      []string        `json:"failed,omitempty"`
}

// Command is `bcd update`: the slots, the release floor, a pending
// update and the versions that failed; --clear-failed lets a failed
// version be tried again.
func Command() cli.Command {
	return cli.Command{Name: "update", Summary: "show the self-update slots, release floor, pending and failed versions (--clear-failed)", Run: run}
}

// HelperBinary is where the packages install bcd helper.
const HelperBinary = "/usr/libexec/bcd/bcd-helper"

func run(ctx context.Context, env *cli.Env, args []string) int {
	flags := cli.NewFlagSet(env, "bcd", "update")
	cfgPath := flags.String("config", config.DefaultPath, "the configuration file")
	asJSON := flags.Bool("json", false, "print the state as JSON")
	clear := flags.Bool("clear-failed", false, "forget the versions that failed, so they may be tried again")
	rollback := flags.Bool("rollback", false, "swap a pending upgrade back now and record its version failed (the crash-loop unit bcd-rollback@.service; root)")
	pending := flags.Bool("pending", false, "exit 0 when an upgrade waits for its confirmation, 1 when none (the crash-loop unit's condition)")
	if code, ok := cli.Parse(flags, env, args, ""); !ok {
		return code
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return cli.Fail(env, "bcd update", err)
	}
	s := &Slots{Dir: SlotsDir(cfg)}
	st := Status{SlotsDir: s.Dir, Pins: len(cfg.Update.ReleasePins), Threshold: cfg.Update.Threshold()}
	r, cur, up, err := s.Read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return cli.Fail(env, "bcd update", err)
	default:
		st.Initialized, st.Current, st.Slots, st.Floor, st.Pending, st.Failed = true, cur, r.Slots, r.Floor, up, r.Failed
	}
	if *pending {
		if st.Pending == nil {
			fmt.Fprintf(env.Stderr, "bcd update: no upgrade pending in %s\n", s.Dir)
			return 1
		}
		fmt.Fprintf(env.Stdout, "pending: %s in %s, to confirm before %s\n", st.Pending.Version, st.Pending.To, st.Pending.Deadline.Format(time.RFC3339))
		return 0
	}
	if *rollback && cfg.Helper.Socket != "" {
		// The slots are the helper's: root's crash-loop path is its own
		// command, under the helper's lock on the slots.
		cmd := exec.CommandContext(ctx, HelperBinary, "update-rollback", "--config", *cfgPath, "--no-restart")
		cmd.Stdout, cmd.Stderr = env.Stderr, env.Stderr
		if err := cmd.Run(); err != nil {
			return cli.Fail(env, "bcd update --rollback", fmt.Errorf("%s update-rollback: %w", HelperBinary, err))
		}
		return 0
	}
	if *rollback {
		v, err := s.Rollback()
		if err != nil {
			return cli.Fail(env, "bcd update --rollback", err)
		}
		if v == "" {
			fmt.Fprintln(env.Stderr, "bcd update: no upgrade pending; nothing rolled back")
		} else {
			fmt.Fprintf(env.Stderr, "bcd update: rolled back %s and recorded it failed\n", v)
		}
		if st.Initialized {
			r, cur, up, err := s.Read()
			if err == nil {
				st.Current, st.Slots, st.Floor, st.Pending, st.Failed = cur, r.Slots, r.Floor, up, r.Failed
			}
		}
	}
	if *clear {
		if !st.Initialized {
			return cli.Fail(env, "bcd update", fmt.Errorf("no slots in %s: nothing failed", s.Dir))
		}
		var err error
		if cfg.Helper.Socket != "" {
			// Root's slots: the helper clears them.
			err = (&helperclient.Client{Socket: cfg.Helper.Socket}).Updater().ClearFailed(ctx)
		} else {
			err = s.ClearFailed()
		}
		if err != nil {
			return cli.Fail(env, "bcd update --clear-failed", err)
		}
		fmt.Fprintf(env.Stderr, "bcd update: cleared %d failed versions (%s)\n", len(st.Failed), strings.Join(st.Failed, ", "))
		st.Failed = nil
	}
	if *asJSON {
		b, _ := json.MarshalIndent(st, "", "  ")
		fmt.Fprintf(env.Stdout, "%s\n", b)
		return 0
	}
	w := env.Stdout
	if st.Pins == 0 {
		fmt.Fprintln(w, "self-update: off (no [update] release_pins)")
	} else {
		fmt.Fprintf(w, "self-update: %d of %d release keys must sign\n", st.Threshold, st.Pins)
	}
	if !st.Initialized {
		fmt.Fprintf(w, "slots: none yet in %s (the first self-update adopts the running binary)\n", s.Dir)
		return 0
	}
	fmt.Fprintf(w, "slots: %s, current %s, release floor %d\n", s.Dir, st.Current, st.Floor)
	for _, name := range []string{SlotA, SlotB} {
		if sl, ok := st.Slots[name]; ok {
			fmt.Fprintf(w, "  %s: %s (sequence %d, sha256 %.12s)\n", name, sl.Version, sl.Sequence, sl.SHA256)
		}
	}
	if st.Pending != nil {
		fmt.Fprintf(w, "pending: %s in %s, to confirm before %s\n", st.Pending.Version, st.Pending.To, st.Pending.Deadline.Format("2006-01-02T15:04:05Z07:00"))
	}
	if len(st.Failed) > 0 {
		fmt.Fprintf(w, "failed: %s (bcd update --clear-failed to try again)\n", strings.Join(st.Failed, ", "))
	}
	return 0
}
