// Package dcgm is the diag.dcgm kind: NVIDIA DCGM's diagnostics through
// `dcgmi diag`, where DCGM is installed, and an honest failure where not.
package dcgm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

// Levels dcgmi diag runs (-r): 1 quick, 2 medium, 3 long, 4 extended.
var levels = map[int]time.Duration{1: 2 * time.Minute, 2: 10 * time.Minute, 3: 45 * time.Minute, 4: 2 * time.Hour}

type body struct {
	Level int `json:"level"` // 1 (default) to 4
}

// Kind returns diag.dcgm running dcgmi (path "" finds it on PATH).
func Kind(path string) dispatch.Kind {
	return dispatch.Kind{Name: "diag.dcgm", Lane: dispatch.LaneBulk, Idempotent: true,
		Resources: func([]byte) ([]string, error) { return []string{"gpus"}, nil },
		Run: func(ctx context.Context, b []byte) (json.RawMessage, error) {
			req := body{Level: 1}
			if len(b) > 0 {
				if err := dispatch.DecodeBody(b, &req); err != nil {
					return nil, err
				}
			}
			limit, ok := levels[req.Level]
			if !ok {
				return nil, errors.New(`body: "level" must be 1, 2, 3 or 4`)
			}
			bin := path
			if bin == "" {
				bin = "dcgmi"
			}
			full, err := exec.LookPath(bin)
			if err != nil {
				return nil, errors.New("dcgmi not found (NVIDIA DCGM is not installed on this machine)")
			}
			ctx, cancel := context.WithTimeout(ctx, limit)
			defer cancel()
			out, err := exec.CommandContext(ctx, full, "diag", "-r", fmt.Sprint(req.Level), "-j").Output()
			if !json.Valid(out) {
				b, _ := json.Marshal(map[string]string{"output": strings.TrimSpace(string(out))})
				out = b
			}
			if err != nil {
				return out, fmt.Errorf("dcgmi diag -r %d = %w", req.Level, err)
			}
			return out, nil
		}}
}
