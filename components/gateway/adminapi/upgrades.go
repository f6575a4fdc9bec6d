package adminapi

import "time"

// UpgradeView is a node's latest daemon.upgrade in its status: the
// release, the command and, through the command, its progress or result.
type UpgradeView struct {
	Version string      `json:"version,omitempty"`
	Sent    time.Time   `json:"sent"`
	Command CommandView `json:"command"`
}
