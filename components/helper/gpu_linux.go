//go:build linux

package helper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/helper/wire"
)

// maxGPUs bounds the GPUs one host's nvidia-smi may list.
const maxGPUs = 1024

// gpuReset resets one GPU of this host's own inventory: the helper asks
// nvidia-smi for the GPUs' UUIDs itself and refuses any other GPU before
// anything runs, then runs nvidia-smi --gpu-reset -i <uuid>. A fakehw
// build checks against its fake machine and only logs the reset.
func (srv *server) gpuReset(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	gpus, err := srv.hostGPUs(ctx)
	if err != nil {
		return failed(fmt.Errorf("gpu.reset: listing this host's GPUs: %w", err), !errors.Is(err, errNoSMI))
	}
	uuid := ""
	for _, g := range gpus {
		if strings.EqualFold(g, req.GPU) {
			uuid = g
		}
	}
	if uuid == "" {
		return refused(fmt.Errorf("gpu.reset: %s is not a GPU of this host (nvidia-smi lists %d)", req.GPU, len(gpus)))
	}
	if srv.s.fakeHW {
		srv.log.Warn("helper: gpu.reset (a fakehw build only logs it)", "gpu", uuid)
		return ok()
	}
	if _, err := srv.s.smi(ctx, "--gpu-reset", "-i", uuid); err != nil {
		return failed(fmt.Errorf("gpu.reset: %w", err), true)
	}
	return ok()
}

// hostGPUs lists this host's GPU UUIDs: nvidia-smi's, or a fakehw build's
// fake machine's.
func (srv *server) hostGPUs(ctx context.Context) ([]string, error) {
	if srv.s.fakeHW {
		return srv.s.fakeGPUs(), nil
	}
	out, err := srv.s.smi(ctx, "--query-gpu=uuid", "--format=csv,noheader")
	if err != nil {
		return nil, err
	}
	return parseGPUList(out)
}

// parseGPUList parses nvidia-smi --query-gpu=uuid --format=csv,noheader:
// one GPU-<uuid> per line, blank lines and surrounding space ignored, at
// most maxGPUs. Anything else is an error: the helper resets only a GPU it
// has read back exactly.
func parseGPUList(out []byte) ([]string, error) {
	var gpus []string
	for _, line := range bytes.Split(out, []byte("\n")) {
		l := strings.TrimSpace(string(line))
		if l == "" {
			continue
		}
		if !wire.IsGPUUUID(l) {
			return nil, fmt.Errorf("nvidia-smi printed %q where a GPU UUID belongs", short(l))
		}
		if len(gpus) == maxGPUs {
			return nil, fmt.Errorf("nvidia-smi listed more than %d GPUs", maxGPUs)
		}
		gpus = append(gpus, l)
	}
	return gpus, nil
}
