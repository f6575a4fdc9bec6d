//go:build fakehw

package main

import (
	"fmt"
	"testing"

	"github.com/better-compute/bcd/components/machine/fakehw"
)

// TestFakeMachine (go test -tags fakehw): a fakehw helper's GPUs, their
// minors and its CPUs are the fake machine's of BCD_FAKEHW_SEED.
func TestFakeMachine(t *testing.T) {
	t.Setenv("BCD_FAKEHW_SEED", "7")
	gpus := fakeGPUs()
	if len(gpus) != fakehw.GPUCount || gpus[0] != fakehw.GPUUUID(7, 0) || gpus[7] != fakehw.GPUUUID(7, 7) {
		t.Errorf("fakeGPUs() = %v", gpus)
	}
	// The GPUs' minors are the inventory's, the same at every call: 0 to
	// 7.
	m := minors()
	if len(m) != fakehw.GPUCount || m[0] != 0 || m[7] != 7 {
		t.Fatalf("minors() = %v, want 0 to 7", m)
	}
	for i, g := range fakehw.Machine(7).GPUs {
		if g.Minor == nil || *g.Minor != m[i] {
			t.Errorf("GPU %d of the inventory has minor %v, the helper %d", i, g.Minor, m[i])
		}
	}
	if again := minors(); fmt.Sprint(again) != fmt.Sprint(m) {
		t.Errorf("minors() = %v, then %v", m, again)
	}
	cpus, mems, err := topology()
	if err != nil || cpus != "0-223" || mems != "0-1" {
		t.Errorf("topology() = %q %q %v, want 0-223 0-1", cpus, mems, err)
	}
}
