package doctor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/better-compute/bcd/components/base/config"
)

// TSS is the `tpm` check under [helper] (socket and user both set): the
// helper's user must not be in the tss group, which opens /dev/tpmrm0 to
// it: the kernel's resource manager filters no command, so that user could
// lock or clear the TPM's hierarchies while bcd helper holds the node keys.
// It fails when the user is in the group (as a member or by its primary
// group), warns when the membership cannot be read, and is left out on a
// host without a tss group or with the user outside it.
func TSS(h config.Helper) []Check { return tssChecks(h, "/etc/passwd", "/etc/group") }

// errNoGroup: the host has no such group.
var errNoGroup = errors.New("no such group")

func tssChecks(h config.Helper, passwd, group string) []Check {
	if h.Socket == "" || h.User == "" {
		return nil
	}
	in, err := inGroup(h.User, "tss", passwd, group)
	switch {
	case errors.Is(err, errNoGroup):
		return nil
	case err != nil:
		return []Check{{Name: "tpm", Run: func(context.Context) Result {
			return Result{Status: Warn, Detail: fmt.Sprintf("cannot tell whether %s is in the tss group: %v", h.User, err)}
		}}}
	case !in:
		return nil
	}
	return []Check{{Name: "tpm", Run: func(context.Context) Result {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s is in the tss group: it can send the TPM any command (lock or clear its hierarchies); bcd helper holds the node keys, so remove it (gpasswd -d %s tss) and restart bcd.service", h.User, h.User)}
	}}}
}

// inGroup reports whether user is in group, as a listed member or by its
// primary group, reading passwd and group files.
func inGroup(user, group, passwd, groupFile string) (bool, error) {
	var gid string
	var members []string
	err := eachLine(groupFile, func(f []string) bool {
		if len(f) >= 4 && f[0] == group {
			gid, members = f[2], strings.Split(f[3], ",")
			return false
		}
		return true
	})
	if err != nil {
		return false, err
	}
	if gid == "" {
		return false, errNoGroup
	}
	if slices.Contains(members, user) {
		return true, nil
	}
	primary := ""
	if err := eachLine(passwd, func(f []string) bool {
		if len(f) >= 4 && f[0] == user {
			primary = f[3]
			return false
		}
		return true
	}); err != nil {
		return false, err
	}
	if primary == "" {
		return false, fmt.Errorf("no user %s in %s", user, passwd)
	}
	return primary == gid, nil
}

// eachLine calls fn with the colon-separated fields of each line of p
// until it returns false.
func eachLine(p string, fn func([]string) bool) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if !fn(strings.Split(s.Text(), ":")) {
			return nil
		}
	}
	return s.Err()
}
