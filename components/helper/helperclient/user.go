package helperclient

import (
	"fmt"
	"os"
	"os/user"
	"strconv"
)

// CheckNodeUser is bcd node's start check under [helper]: it must run as
// [helper] user, the one account bcd helper serves besides root, and never
// as root (it would do its privileged work itself, and the helper would
// separate nothing). The error says which account to start it as.
func CheckNodeUser(name string) error {
	return checkNodeUser(os.Geteuid(), name, func(n string) (int, error) {
		u, err := user.Lookup(n)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(u.Uid)
	})
}

func checkNodeUser(euid int, name string, lookup func(string) (int, error)) error {
	uid, err := lookup(name)
	if err != nil {
		return fmt.Errorf("[helper] user %s: %w (create the account, or fix [helper] user in config.toml)", name, err)
	}
	switch {
	case euid == 0:
		return fmt.Errorf("runs as root, but config.toml has [helper]: start bcd node as %s (uid %d), as the bcd.service drop-in 10-unprivileged.conf of install.sh --unprivileged does, and bcd helper as root; or remove [helper] from config.toml to run bcd node as root", name, uid)
	case euid != uid:
		return fmt.Errorf("runs as uid %d, but [helper] user is %s (uid %d), the only account bcd helper serves: start bcd node as %s", euid, name, uid, name)
	}
	return nil
}
