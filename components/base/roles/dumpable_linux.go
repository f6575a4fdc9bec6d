package roles

import "golang.org/x/sys/unix"

// notDumpable clears the process's dumpable flag before a role does
// anything: another process of the same uid (what an attacker who has
// the node account runs besides bcd) then cannot ptrace it, read its
// /proc/PID/mem, or copy a socket it holds with pidfd_getfd, such as a
// connection to bcd helper that passed the helper's /proc/PID/exe
// check (docs/helper.md, "Who it serves"). It also means no core dump.
// The flag is reset by execve, so every role binary sets it again.
func notDumpable() error { return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) }
