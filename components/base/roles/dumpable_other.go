//go:build !linux

package roles

// notDumpable is Linux's; elsewhere there is no /proc/PID/exe check to
// protect.
func notDumpable() error { return nil }
