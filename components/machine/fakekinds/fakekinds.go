// Package fakekinds holds command kinds that exist only in fakehw builds,
// for tests that need a visible side effect: fakehw.mark appends the
// command's id to a marker file, so a test can count how many times each
// command's side effect happened.
package fakekinds

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/base/backoff"
)

// MarkFile is the marker file under the data directory.
const MarkFile = "fakehw/marks.log"

type markBody struct {
	// SleepMS is spent half before and half after writing the marker, so a
	// crash can land on either side of the side effect.
	SleepMS int  `json:"sleep_ms"`
	Bulk    bool `json:"-"`
}

// Kinds returns the fakehw-only kinds writing under dataDir.
func Kinds(dataDir string) []dispatch.Kind {
	return []dispatch.Kind{
		{Name: "fakehw.mark", Lane: dispatch.LaneControl, Run: mark(dataDir)},
		{Name: "fakehw.mark-bulk", Lane: dispatch.LaneBulk, Run: mark(dataDir)},
	}
}

func mark(dataDir string) func(ctx context.Context, body []byte) (json.RawMessage, error) {
	return func(ctx context.Context, body []byte) (json.RawMessage, error) {
		var b markBody
		if len(body) > 0 {
			if err := json.Unmarshal(body, &b); err != nil {
				return nil, fmt.Errorf("body: %w", err)
			}
		}
		if b.SleepMS < 0 || b.SleepMS > 60000 {
			return nil, fmt.Errorf("sleep_ms must be within 0..60000")
		}
		half := time.Duration(b.SleepMS) * time.Millisecond / 2
		if err := backoff.Sleep(ctx, half); err != nil {
			return nil, err
		}
		id := dispatch.CommandID(ctx)
		p := filepath.Join(dataDir, MarkFile)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, err
		}
		_, err = fmt.Fprintf(f, "%s %d\n", id, time.Now().UnixMilli())
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("write %s: %w", p, err)
		}
		if err := backoff.Sleep(ctx, half); err != nil {
			return nil, err
		}
		return json.Marshal(map[string]string{"marked": id})
	}
}
