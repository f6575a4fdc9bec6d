package selfupdate

import (
	"path/filepath"

	"github.com/better-compute/bcd/components/base/config"
)

// HelperSlotsDir is where the slots are under [helper]: root's, outside
// the node's data directory.
const HelperSlotsDir = "/usr/local/lib/bcd"

// SlotsDir is where cfg keeps the slots: [update] slots_dir, else root's
// HelperSlotsDir under [helper], else data_dir/bin.
func SlotsDir(cfg *config.Config) string {
	switch {
	case cfg.Update.SlotsDir != "":
		return cfg.Update.SlotsDir
	case cfg.Helper.Socket != "":
		return HelperSlotsDir
	}
	return filepath.Join(cfg.DataDir, "bin")
}
