//go:build !linux

package doctor

import (
	"errors"
	"time"
)

// adjtimex is Linux's; elsewhere the clock check falls back to
// systemd-timesyncd's mark.
func adjtimex() (bool, time.Duration, error) {
	return false, 0, errors.New("adjtimex: not on this operating system")
}
