//go:build fakehw

package update

import (
	"os"
	"syscall"
	"time"
)

// testHooks lets a fakehw build's end-to-end tests shorten the confirm
// window (BCD_UPDATE_WINDOW, a Go duration) and kill the process with
// SIGKILL at one named step of the swap (BCD_UPDATE_KILL_AT).
func testHooks(s *Slots) {
	if d, err := time.ParseDuration(os.Getenv("BCD_UPDATE_WINDOW")); err == nil && d > 0 {
		s.Window = d
	}
	if at := os.Getenv("BCD_UPDATE_KILL_AT"); at != "" {
		s.SetCrash(func(point string) {
			if point == at {
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				time.Sleep(time.Minute)
			}
		})
	}
}
