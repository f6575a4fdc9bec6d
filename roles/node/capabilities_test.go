package main

import (
	"slices"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Hello says tunnel.instance-dial only where a runtime runs and instance
// tickets have their targets; a host without a runtime says nothing.
func TestCapabilitiesInstanceDial(t *testing.T) {
	cfg := &config.Config{}
	rt := []*bcdv1.Driver{{Id: "libvirt-kvm", Kind: "runtime"}}
	if got := capabilities(cfg, rt, true); !slices.Contains(got, "tunnel.instance-dial") || !slices.Contains(got, "vm.runtime.libvirt-kvm") {
		t.Errorf("a runtime with instance dials: %q", got)
	}
	if got := capabilities(cfg, rt, false); slices.Contains(got, "tunnel.instance-dial") {
		t.Errorf("no instance targets, yet %q", got)
	}
	if got := capabilities(cfg, nil, true); got != nil {
		t.Errorf("no runtime: %q", got)
	}
}
