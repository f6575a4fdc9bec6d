//go:build fakehw

package main

import (
	"testing"

	"github.com/better-compute/bcd/components/machine/fakehw"
)

// TestFakeMachine (go test -tags fakehw): a fakehw helper's GPUs and CPUs
// are the fake machine's of BCD_FAKEHW_SEED.
func TestFakeMachine(t *testing.T) {
	t.Setenv("BCD_FAKEHW_SEED", "7")
	gpus := fakeGPUs()
	if len(gpus) != fakehw.GPUCount || gpus[0] != fakehw.GPUUUID(7, 0) || gpus[7] != fakehw.GPUUUID(7, 7) {
		t.Errorf("fakeGPUs() = %v", gpus)
	}
	cpus, mems, err := topology()
	if err != nil || cpus != "0-223" || mems != "0-1" {
		t.Errorf("topology() = %q %q %v, want 0-223 0-1", cpus, mems, err)
	}
}
