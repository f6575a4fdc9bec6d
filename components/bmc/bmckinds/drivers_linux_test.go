package bmckinds

import (
	"crypto/sha256"
	"encoding/hex"
	"syscall"
)

func sha256hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func syscallKill(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }
