//go:build !fakehw

package main

import "github.com/better-compute/bcd/components/helper"

// fakeMachine is nil in a host build: the helper reads the real machine.
func fakeMachine() *helper.FakeMachine { return nil }
