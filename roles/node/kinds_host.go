//go:build !fakehw

package main

import (
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/config"
	"github.com/better-compute/bcd/components/dispatch"
)

func fakeKinds(*config.Config) []dispatch.Kind { return nil }

func fakeCommands() []cli.Command { return nil }
