package gateway

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
)

// storeRetry is the first and the longest wait between attempts to reach
// an unreachable database.
var storeRetry = [2]time.Duration{time.Second, 30 * time.Second}

// openStore opens the store cfg names: PostgreSQL when cfg.Database is
// set (its schema brought up to date), else the bbolt file in the data
// directory. A database that does not answer is tried again, each
// failure logged with what was dialled, until it answers or ctx ends.
func openStore(ctx context.Context, cfg Config) (store.Store, error) {
	if cfg.Database == "" {
		return store.Open(filepath.Join(cfg.DataDir, "bcgw.db"))
	}
	wait := storeRetry[0]
	for {
		octx, cancel := context.WithTimeout(ctx, time.Minute)
		st, err := pgstore.Open(octx, cfg.Database)
		cancel()
		if err == nil {
			cfg.Log.Info("store on PostgreSQL", "schema_version", pgstore.SchemaVersion())
			return st, nil
		}
		if !errors.Is(err, pgstore.ErrUnreachable) || ctx.Err() != nil {
			return nil, fmt.Errorf("gateway: store: %w", err)
		}
		cfg.Log.Warn("database unreachable; retrying", "err", err.Error(), "retry_in", wait.String())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gateway: store: %w", err)
		case <-time.After(wait):
		}
		wait = min(2*wait, storeRetry[1])
	}
}
