//go:build linux

package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/release"
	"github.com/better-compute/bcd/components/trust/selfupdate"
)

// watchdogGrace is how long past its deadline the helper leaves an
// unconfirmed upgrade to the node's own Settle before it swaps it back
// itself and restarts the node.
const watchdogGrace = 30 * time.Second

// nodeUnit is the node's systemd unit, restarted after the watchdog
// swapped back.
const nodeUnit = "bcd.service"

// errRollbackIsRoots is update.rollback's answer to the node.
var errRollbackIsRoots = errors.New("update.rollback is not served to the node: a pending upgrade is swapped back at its deadline (Settle, and the helper's own watchdog 30 s later) or by the crash-loop unit as root (bcd-helper update-rollback)")

// errClearFailedIsRoots is update.clear_failed's answer to the node: a
// node that could forget the failed versions could have a release that
// failed tried again and again.
var errClearFailedIsRoots = errors.New("update.clear_failed is root's: run bcd update --clear-failed as root")

// startUpdate builds the update.* operations' Manager from the helper's
// own configuration: off without release pins; refused when the slots
// directory is inside the node's data directory or contains it, or is
// not root's all the way down (it is created 0755 when missing).
func (srv *server) startUpdate() error {
	u := srv.cfg.Update
	if len(u.Pins) == 0 {
		return nil
	}
	if !filepath.IsAbs(u.SlotsDir) || filepath.Clean(u.SlotsDir) != u.SlotsDir {
		return fmt.Errorf("update.slots_dir: %q must be an absolute, clean path", u.SlotsDir)
	}
	if !filepath.IsAbs(u.DataDir) {
		return fmt.Errorf("data_dir: %q must be an absolute path", u.DataDir)
	}
	data := filepath.Clean(u.DataDir)
	if under(u.SlotsDir, data) || under(data, u.SlotsDir) {
		return fmt.Errorf("update.slots_dir %s overlaps data_dir %s: under [helper] the slots are root's and outside what the node writes (the default is %s)", u.SlotsDir, data, selfupdate.HelperSlotsDir)
	}
	if err := srv.checkDirs(u.SlotsDir, true, "the self-update slots live there"); err != nil {
		return err
	}
	srv.upd = &selfupdate.Manager{
		Slots: &selfupdate.Slots{Dir: u.SlotsDir, Now: srv.s.now},
		Pins:  u.Pins, Threshold: u.Threshold,
		Role: "node", Arch: runtime.GOARCH,
		StagingDir: filepath.Join(data, selfupdate.StagingDir), Owner: int(srv.uid),
		Adopt: u.Adopt, AdoptVersion: buildinfo.Version, AdoptSequence: u.AdoptSequence,
		// Root will run what it adopts; a fakehw helper runs as a user.
		RootAdopt: srv.s.euid == 0,
		Now:       srv.s.now,
	}
	srv.rearm = make(chan struct{}, 1)
	return nil
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// lockSlots takes an exclusive flock on the slots directory, shared by
// the operations, the watchdog and bcd-helper update-rollback.
func lockSlots(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the slots directory %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("flock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

type peerKey struct{}

// update serves the update.* operations. Nothing the node sends but a
// signed document is taken: the staged file's name and place, the
// running version and the clock are the helper's own.
func (srv *server) update(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	if srv.upd == nil {
		return refused(errors.New("self-update through bcd helper is off: the helper's configuration has no [update] release_pins"))
	}
	unlock, err := lockSlots(srv.upd.Slots.Dir)
	if err != nil {
		return failed(err, true)
	}
	defer unlock()
	var v any
	switch req.Op {
	case wire.OpUpdateStatus:
		v, err = srv.upd.Status(ctx)
	case wire.OpUpdatePrepare:
		v, err = srv.upd.Prepare(ctx, req.Document)
	case wire.OpUpdateSwap:
		var up selfupdate.Upgrade
		if up, err = srv.upd.Swap(ctx, req.Document); err == nil {
			srv.log.Warn("helper: self-update swapped", "version", up.Version, "sequence", up.Sequence,
				"from", up.From, "to", up.To, "deadline", up.Deadline)
			srv.rearmWatchdog()
		}
		v = up
	case wire.OpUpdateConfirm:
		var ok bool
		if err = srv.peerRunsPending(ctx); err == nil {
			ok, err = srv.upd.Confirm(ctx)
		}
		v = wire.UpdateConfirmed{Confirmed: ok}
	case wire.OpUpdateSettle:
		var back string
		back, err = srv.upd.Settle(ctx)
		v = wire.UpdateRolledBack{RolledBack: back}
	case wire.OpUpdateRollback:
		err = errRollbackIsRoots
	case wire.OpUpdateClearFailed:
		if p, _ := ctx.Value(peerKey{}).(peerCred); p.uid != 0 {
			err = errClearFailedIsRoots
		} else {
			err = srv.upd.ClearFailed(ctx)
		}
	}
	if err != nil {
		// The client names the operation; a final refusal travels as its
		// reason, which the client wraps in a *release.FinalError again.
		var f *release.FinalError
		if errors.As(err, &f) {
			return &wire.Response{Error: f.Err.Error(), Final: true}, "refused"
		}
		return refused(err)
	}
	if v == nil {
		return ok()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return failed(err, false)
	}
	return &wire.Response{OK: true, Update: b}, "ok"
}

// peerRunsPending requires the caller of update.confirm to run the
// pending upgrade's slot binary itself (its /proc/PID/exe is that file):
// the old binary, still running between the swap and the restart, does
// not confirm the new one, whatever it claims.
func (srv *server) peerRunsPending(ctx context.Context) error {
	_, _, up, err := srv.upd.Slots.Read()
	if errors.Is(err, fs.ErrNotExist) || err == nil && up == nil {
		return nil // nothing to confirm: Confirm answers false
	}
	if err != nil {
		return err
	}
	p, _ := ctx.Value(peerKey{}).(peerCred)
	fi, err := os.Stat(filepath.Join(srv.upd.Slots.Dir, up.To))
	if err != nil {
		return err
	}
	if p.exe == nil || !os.SameFile(p.exe, fi) {
		return fmt.Errorf("the caller (pid %d) does not run the pending release %s (%s): only the new binary confirms it", p.pid, up.Version, up.To)
	}
	return nil
}

func (srv *server) rearmWatchdog() {
	select {
	case srv.rearm <- struct{}{}:
	default:
	}
}

// watchdog swaps back an upgrade still unconfirmed watchdogGrace after
// its deadline and restarts the node, whatever the node does. It looks
// at upgrade.json at the helper's start (so a helper restarted in
// between still does it) and after every swap.
func (srv *server) watchdog(ctx context.Context) {
	for {
		wait := srv.watchdogCheck(ctx)
		var timer *time.Timer
		var fire <-chan time.Time
		if wait >= 0 {
			if p := srv.s.watchdogPoll; p > 0 && wait > p {
				wait = p
			}
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-ctx.Done():
		case <-srv.rearm:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// watchdogCheck does the watchdog's work once and returns when to look
// again (-1: nothing pending, wait for a swap).
func (srv *server) watchdogCheck(ctx context.Context) time.Duration {
	const again = time.Minute
	unlock, err := lockSlots(srv.upd.Slots.Dir)
	if err != nil {
		srv.log.Warn("helper: self-update watchdog", "error", err.Error())
		return again
	}
	defer unlock()
	_, _, up, err := srv.upd.Slots.Read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return -1
	case err != nil:
		srv.log.Warn("helper: self-update watchdog", "error", err.Error())
		return again
	case up == nil:
		return -1
	}
	due := up.Deadline.Add(watchdogGrace)
	if now := srv.s.now(); now.Before(due) {
		return due.Sub(now)
	}
	back, err := srv.upd.Settle(ctx)
	if err != nil {
		srv.log.Warn("helper: self-update watchdog: swapping back", "version", up.Version, "error", err.Error())
		return again
	}
	if back == "" {
		return -1 // confirmed, or the swap never happened: dropped
	}
	srv.log.Warn("helper: self-update not confirmed in time: swapped back", "version", back,
		"deadline", up.Deadline, "to", up.From)
	srv.restartNode(ctx)
	return -1
}

// restartNode restarts bcd.service (a fakehw build only logs it).
func (srv *server) restartNode(ctx context.Context) {
	if srv.s.fakeHW {
		srv.log.Warn("helper: restart of " + nodeUnit + " (a fakehw build only logs it)")
		return
	}
	if _, err := srv.s.systemctl(ctx, "restart", nodeUnit); err != nil {
		srv.log.Warn("helper: restarting "+nodeUnit, "error", err.Error())
	}
}

// RollbackNow is bcd-helper update-rollback: as root, it swaps back a
// pending upgrade that current points at, records its version failed,
// and (unless restart is false) restarts bcd.service. The crash-loop unit
// runs it when the new binary does not stay up. It answers the version
// swapped back, "" when nothing was pending.
func RollbackNow(ctx context.Context, cfg Config, restart bool) (string, error) {
	return rollbackNow(ctx, cfg, hostSeams(), restart)
}

func rollbackNow(ctx context.Context, cfg Config, s seams, restart bool) (string, error) {
	if s.euid != 0 && !s.fakeHW {
		return "", fmt.Errorf("runs as root (this process runs as uid %d)", s.euid)
	}
	srv := &server{cfg: cfg, s: s}
	if err := srv.startUpdate(); err != nil {
		return "", err
	}
	if srv.upd == nil {
		return "", errors.New("self-update is off: the configuration has no [update] release_pins")
	}
	unlock, err := lockSlots(srv.upd.Slots.Dir)
	if err != nil {
		return "", err
	}
	_, cur, up, err := srv.upd.Slots.Read()
	if errors.Is(err, fs.ErrNotExist) || err == nil && (up == nil || cur != up.To) {
		unlock()
		return "", nil
	}
	if err != nil {
		unlock()
		return "", err
	}
	back, err := srv.upd.Rollback(ctx)
	unlock()
	if err != nil || back == "" || !restart {
		return back, err
	}
	if _, err := s.systemctl(ctx, "reset-failed", nodeUnit); err != nil {
		return back, fmt.Errorf("swapped back %s, but systemctl reset-failed %s: %w", back, nodeUnit, err)
	}
	if _, err := s.systemctl(ctx, "--no-block", "restart", nodeUnit); err != nil {
		return back, fmt.Errorf("swapped back %s, but systemctl restart %s: %w", back, nodeUnit, err)
	}
	return back, nil
}
