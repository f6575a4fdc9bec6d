package main

import (
	"log/slog"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch/kindtable"
	"github.com/better-compute/bcd/components/disk/ramdiskcmd"
)

// TestKindTable: the ramdisk accepts exactly the kinds of kinds.txt and
// refuses every node and site kind as UNSUPPORTED.
func TestKindTable(t *testing.T) {
	kindtable.Check(t, "ramdisk", kinds(ramdiskcmd.Env{CacheURL: "http://127.0.0.1:1", Log: slog.New(slog.DiscardHandler)}))
}
