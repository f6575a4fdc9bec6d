//go:build linux

package helper

import (
	"errors"
	"fmt"

	"github.com/better-compute/bcd/components/helper/anchor"
)

// anchors opens root's trust anchors from [helper] state_dir, anew for
// each request that needs them, so a join record bcd join wrote since the
// helper started counts at once. The directory and every one above it
// must be root's and closed to others; a missing one is created.
func (srv *server) anchors() (*anchor.Anchors, error) {
	if srv.cfg.StateDir == "" {
		return nil, errors.New("no [helper] state_dir: root has no trust anchors")
	}
	if err := srv.checkDirs(srv.cfg.StateDir, true, "root's trust anchors are there"); err != nil {
		return nil, err
	}
	a, err := anchor.Open(srv.cfg.StateDir, srv.cfg.JoinSigningPin, srv.cfg.CommandRoots)
	if err != nil {
		return nil, fmt.Errorf("root's trust anchors: %w", err)
	}
	return a, nil
}
