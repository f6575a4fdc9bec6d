// Package update is the node's side of self-update: `bcd update` and the
// node's names for the A/B slots and the Installer, which live in
// components/trust/selfupdate so that bcd helper runs the same code
// (docs/update.md).
package update

import "github.com/better-compute/bcd/components/trust/selfupdate"

// The slots and the Manager live in components/trust/selfupdate, so that
// bcd helper (which may not import the agent domain) runs the same code;
// these names keep the node's `update.X` spelling.

type (
	Installer = selfupdate.Installer
	Manager   = selfupdate.Manager
	State     = selfupdate.State
	Prepared  = selfupdate.Prepared
	Slots     = selfupdate.Slots
	Slot      = selfupdate.Slot
	Record    = selfupdate.Record
	Upgrade   = selfupdate.Upgrade
)

// The slots directory's names and the confirmation window.
const (
	SlotA          = selfupdate.SlotA
	SlotB          = selfupdate.SlotB
	Current        = selfupdate.Current
	SlotsFile      = selfupdate.SlotsFile
	UpgradeFile    = selfupdate.UpgradeFile
	StagingDir     = selfupdate.StagingDir
	ConfirmWindow  = selfupdate.ConfirmWindow
	HelperSlotsDir = selfupdate.HelperSlotsDir
)

var (
	SlotsDir   = selfupdate.SlotsDir
	StagedName = selfupdate.StagedName
	Download   = selfupdate.Download
	OpenStaged = selfupdate.OpenStaged
)
