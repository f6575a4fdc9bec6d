//go:build fakehw

package main

import (
	"os"
	"sort"
	"strconv"

	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/machine/fakehw"
)

// fakeMachine is the fake machine of a fakehw build, which the helper
// checks gpu.reset, slice.apply and the device nodes of CDI specs
// against.
func fakeMachine() *helper.FakeMachine {
	return &helper.FakeMachine{GPUs: fakeGPUs, Topology: topology, Minors: minors, MIGCaps: fakehw.MIGCaps}
}

// hostUnits is nil in a fakehw build: its helper may run as root beside
// tests, and host.unit would change the real kernel of the machine the
// tests run on; every host.unit is refused.
func hostUnits() helper.HostUnits { return nil }

// fakeSeed is the fake machine of BCD_FAKEHW_SEED (default 1), as bcd node
// in a fakehw build reads it.
func fakeSeed() int64 {
	if v := os.Getenv("BCD_FAKEHW_SEED"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	return 1
}

// fakeGPUs are the fake machine's GPUs.
func fakeGPUs() []string {
	seed := fakeSeed()
	out := make([]string, fakehw.GPUCount)
	for i := range out {
		out[i] = fakehw.GPUUUID(seed, i)
	}
	return out
}

// minors are the device minors of the fake machine's GPUs
// (/dev/nvidia<minor>), as its inventory gives them to bcd node.
func minors() []int {
	var out []int
	for _, g := range fakehw.Machine(fakeSeed()).GPUs {
		if g.Minor != nil {
			out = append(out, *g.Minor)
		}
	}
	return out
}

// topology is the fake machine's CPUs and NUMA nodes.
func topology() (cpus, mems string, err error) {
	var all, nodes []int
	for _, n := range fakehw.Machine(fakeSeed()).CPU.NUMA {
		c, err := wire.ParseCPUList(n.CPUs)
		if err != nil {
			return "", "", err
		}
		all = append(all, c...)
		nodes = append(nodes, n.ID)
	}
	sort.Ints(all)
	sort.Ints(nodes)
	return wire.FormatCPUList(all), wire.FormatCPUList(nodes), nil
}
