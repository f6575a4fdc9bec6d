package unit

import (
	"context"
	"fmt"
	"strings"
)

// What the NVIDIA units share: nvidia-smi's CSV queries and the shape of
// a GPU UUID.

// smiQuery runs nvidia-smi --query-<what>=fields --format=csv,noheader,nounits
// and answers one row per line, each with len(fields) trimmed values.
func smiQuery(ctx context.Context, sys System, what string, fields ...string) ([][]string, error) {
	out, err := sys.Run(ctx, "nvidia-smi", "--query-"+what+"="+strings.Join(fields, ","), "--format=csv,noheader,nounits")
	if err != nil {
		return nil, err
	}
	var rows [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		f := strings.Split(l, ",")
		if len(f) != len(fields) {
			return nil, fmt.Errorf("nvidia-smi --query-%s: %q has %d fields, want %d", what, clip(l), len(f), len(fields))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		rows = append(rows, f)
	}
	return rows, nil
}

// gpuUUIDs are the host's GPUs as nvidia-smi lists them.
func gpuUUIDs(ctx context.Context, sys System) ([]string, error) {
	rows, err := smiQuery(ctx, sys, "gpu", "uuid")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rows {
		out = append(out, r[0])
	}
	return out, nil
}

// checkGPUs checks the GPUs a spec names against the host's (a GPU the
// host lacks is refused, not retried).
func checkGPUs(ctx context.Context, sys System, want []string) error {
	have, err := gpuUUIDs(ctx, sys)
	if err != nil {
		return err
	}
	for _, g := range want {
		found := false
		for _, h := range have {
			if strings.EqualFold(g, h) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%w: %s is not a GPU of this host (nvidia-smi lists %d)", ErrRefused, g, len(have))
		}
	}
	return nil
}
