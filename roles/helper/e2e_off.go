//go:build !helpere2e

package main

import "github.com/better-compute/bcd/components/base/cli"

// e2eCommands is empty in a release build: helper-call exists only with
// the helpere2e build tag.
func e2eCommands() []cli.Command { return nil }
