package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// HelperTimeout bounds the helper check's ping.
const HelperTimeout = 5 * time.Second

// helperRestart is the way back for a helper that is not there.
const helperRestart = "systemctl restart bcd-helper.service; journalctl -u bcd-helper.service says why it stopped"

// Helper checks bcd helper under [helper] (socket and user both set; no
// check otherwise): every directory from / down to the socket and the
// entrypoint is root's alone, as the helper requires to start; the socket
// is there; and it answers a ping from this process, so the helper runs
// and lets this caller in. Each failure says how to fix it.
func Helper(h config.Helper) []Check {
	if h.Socket == "" || h.User == "" {
		return nil
	}
	c := &helperclient.Client{Socket: h.Socket}
	return []Check{helperCheck(h, "/", 0, c.Ping)}
}

// helperCheck checks from top down, requiring owner's directories.
func helperCheck(h config.Helper, top string, owner uint32, ping func(context.Context) error) Check {
	return Check{Name: "helper", Run: func(ctx context.Context) Result {
		r := Result{Name: "helper", Status: Fail}
		var problems []string
		problems = append(problems, rootsAlone(top, filepath.Dir(h.Socket), owner, "the helper socket lives there")...)
		if h.Entrypoint != "" {
			problems = append(problems, rootsAlone(top, filepath.Dir(h.Entrypoint), owner, "[helper] entrypoint is there")...)
		}
		if len(problems) > 0 {
			r.Detail = strings.Join(problems, "; ") + ", so bcd helper refuses to start: chown root:root and chmod go-w each"
			return r
		}
		fi, err := os.Lstat(filepath.Join(top, h.Socket))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.Detail = fmt.Sprintf("no socket at %s: bcd helper is not running (%s)", h.Socket, helperRestart)
			return r
		case errors.Is(err, fs.ErrPermission):
			r.Detail = fmt.Sprintf("cannot see %s as this user: run bcd doctor as root or as %s", h.Socket, h.User)
			return r
		case err != nil:
			r.Detail = err.Error()
			return r
		case fi.Mode()&fs.ModeSocket == 0:
			r.Detail = fmt.Sprintf("%s is not a socket (%v): bcd helper is not serving there (%s)", h.Socket, fi.Mode().Type(), helperRestart)
			return r
		}
		pctx, cancel := context.WithTimeout(ctx, HelperTimeout)
		defer cancel()
		begin := time.Now()
		err = ping(pctx)
		took := time.Since(begin)
		var herr *helperclient.Error
		switch {
		case err == nil:
			r.Status, r.Detail = OK, fmt.Sprintf("%s answers in %s; bcd node runs as %s", h.Socket, roundTook(took), h.User)
		case errors.As(err, &herr) && herr.Msg == "not allowed":
			r.Detail = fmt.Sprintf("bcd helper at %s refused this process (not allowed): run bcd doctor as root or as %s, from the installed bcd ([helper] entrypoint); the helper's log says why (journalctl -u bcd-helper.service)", h.Socket, h.User)
		case errors.As(err, &herr) && herr.Retryable:
			r.Status, r.Detail = Warn, fmt.Sprintf("bcd helper at %s is busy: %s", h.Socket, herr.Msg)
		case errors.As(err, &herr):
			r.Detail = fmt.Sprintf("bcd helper at %s answered: %s (a helper of another version: restart bcd-helper.service so it runs this bcd's)", h.Socket, herr.Msg)
		case errors.Is(err, syscall.ECONNREFUSED):
			r.Detail = fmt.Sprintf("nothing listens on %s: bcd helper is not running (%s)", h.Socket, helperRestart)
		case errors.Is(err, syscall.EACCES):
			r.Detail = fmt.Sprintf("this user may not connect to %s (0660, root and %s's group): run bcd doctor as root or as %s", h.Socket, h.User, h.User)
		case errors.Is(err, context.DeadlineExceeded):
			r.Detail = fmt.Sprintf("bcd helper at %s did not answer within %s (%s)", h.Socket, HelperTimeout, helperRestart)
		default:
			r.Detail = fmt.Sprintf("bcd helper at %s: %v", h.Socket, err)
		}
		return r
	}}
}

// rootsAlone lists each directory from top down to dir (both as seen
// under top) that is a symlink, not owner's, or writable by group or
// others, in the words bcd helper refuses to start with. A directory that
// does not exist yet ends the walk: the helper creates it 0755.
func rootsAlone(top, dir string, owner uint32, why string) []string {
	var out []string
	p := "/"
	parts := strings.Split(strings.Trim(filepath.Clean(dir), "/"), "/")
	for i := -1; i < len(parts); i++ {
		if i >= 0 {
			if parts[i] == "" {
				continue
			}
			p = filepath.Join(p, parts[i])
		}
		fi, err := os.Lstat(filepath.Join(top, p))
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		bad := fmt.Sprintf("%s must be a directory root owns that no one else can write (%s)", p, why)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", bad, err))
			break
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !fi.IsDir() || !ok || st.Uid != owner || fi.Mode().Perm()&0o022 != 0 {
			out = append(out, bad)
		}
	}
	return out
}
