package doctor

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// adjtimex reads the kernel clock's status without changing it (modes 0,
// which needs no privilege).
func adjtimex() (synced bool, estError time.Duration, err error) {
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	if err != nil {
		return false, 0, fmt.Errorf("adjtimex: %w", err)
	}
	synced = state != unix.TIME_ERROR && tx.Status&unix.STA_UNSYNC == 0
	return synced, time.Duration(tx.Esterror) * time.Microsecond, nil
}
