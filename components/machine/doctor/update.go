package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/agent/update"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/filehash"
)

// Update is the self-update checks (docs/update.md): release pins
// missing (a warning: self-update is refused), and once the slots are in
// use, current naming a complete binary (its SHA-256 the one recorded),
// the entrypoint (the bcd the unit starts, entrypoint here) running
// through current, a pending upgrade and each failed version.
func Update(cfg *config.Config, entrypoint string) Check {
	return Check{Name: "update", Many: func(context.Context) []Result {
		return updateResults(cfg, entrypoint, time.Now())
	}}
}

func updateResults(cfg *config.Config, entrypoint string, now time.Time) []Result {
	res := func(s Status, format string, a ...any) Result {
		return Result{Name: "update", Status: s, Detail: fmt.Sprintf(format, a...)}
	}
	var out []Result
	if n := len(cfg.Update.ReleasePins); n == 0 {
		out = append(out, res(Warn, "no [update] release_pins: every release is refused (self-update is off)"))
	} else {
		out = append(out, res(OK, "%d of %d release keys must sign", cfg.Update.Threshold(), n))
	}
	s := &update.Slots{Dir: update.SlotsDir(cfg)}
	r, cur, up, err := s.Read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return append(out, res(OK, "no slots yet in %s: the first self-update adopts the running binary", s.Dir))
	case errors.Is(err, fs.ErrPermission):
		return append(out, res(Warn, "%v (run bcd doctor as root)", err))
	case err != nil:
		return append(out, res(Fail, "the slots in %s: %v (bcd update shows them)", s.Dir, err))
	}
	curPath := filepath.Join(s.Dir, update.Current)
	if sum, err := filehash.SHA256(filepath.Join(s.Dir, cur)); err != nil || sum != r.Slots[cur].SHA256 {
		out = append(out, res(Fail, "%s names %s, which is not the binary recorded for it (%v): the node may not start; bcd update shows the slots", curPath, cur, err))
	} else {
		out = append(out, res(OK, "%s runs %s (%s), release floor %d", curPath, r.Slots[cur].Version, cur, r.Floor))
	}
	out = append(out, entrypointResult(entrypoint, curPath, res))
	if pr, ok := packageResult(entrypoint, r, cur, res); ok {
		out = append(out, pr)
	}
	if up != nil {
		st := Warn
		left := up.Deadline.Sub(now).Round(time.Second)
		detail := fmt.Sprintf("an upgrade to %s waits for its confirmation (deadline in %s)", up.Version, left)
		if left <= 0 {
			detail = fmt.Sprintf("an upgrade to %s was not confirmed by its deadline: the next start swaps back", up.Version)
		}
		out = append(out, res(st, "%s", detail))
	}
	for _, v := range r.Failed {
		out = append(out, res(Warn, "release %s failed and is not tried again (bcd update --clear-failed)", v))
	}
	return out
}

// entrypointResult: the entrypoint must run current, either as a link
// to it or as a bcd that executes it at start (the package's /usr/bin/bcd
// does: update.Trampoline). A link elsewhere bypasses the slots.
func entrypointResult(entrypoint, curPath string, res func(Status, string, ...any) Result) Result {
	if entrypoint == "" {
		return res(Warn, "the entrypoint is unknown")
	}
	fi, err := os.Lstat(entrypoint)
	if err != nil {
		return res(Fail, "the entrypoint %s: %v", entrypoint, err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return res(OK, "the entrypoint %s executes %s at start", entrypoint, curPath)
	}
	a, err1 := os.Stat(entrypoint)
	b, err2 := os.Stat(curPath)
	if err1 != nil || err2 != nil || !os.SameFile(a, b) {
		return res(Fail, "the entrypoint %s is a link that does not lead to %s: what starts bypasses the slots (link it to %s)", entrypoint, curPath, curPath)
	}
	return res(OK, "the entrypoint %s links to %s", entrypoint, curPath)
}

// packageResult warns when the entrypoint is a regular file that is none
// of the slots' binaries: the package manager replaced it (an apt upgrade
// after the first self-update), and the slots go on running current,
// so the upgrade an operator installed does not run (docs/update.md).
func packageResult(entrypoint string, r update.Record, cur string, res func(Status, string, ...any) Result) (Result, bool) {
	fi, err := os.Lstat(entrypoint)
	if err != nil || !fi.Mode().IsRegular() {
		return Result{}, false
	}
	sum, err := filehash.SHA256(entrypoint)
	if err != nil {
		return Result{}, false
	}
	for _, sl := range r.Slots {
		if sl.SHA256 == sum {
			return Result{}, false
		}
	}
	return res(Warn, "the package's %s (changed %s) is none of the slots' binaries, and the slots run %s: since the first self-update a package upgrade changes what runs only through a release (publish it with bcgw release publish; docs/update.md)",
		entrypoint, fi.ModTime().UTC().Format(time.RFC3339), r.Slots[cur].Version), true
}
