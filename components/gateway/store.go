package gateway

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
)

// openStore opens the store cfg names: PostgreSQL when cfg.Database is
// set (its schema brought up to date), else the bbolt file in the data
// directory.
func openStore(cfg Config) (store.Store, error) {
	if cfg.Database == "" {
		return store.Open(filepath.Join(cfg.DataDir, "bcgw.db"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := pgstore.Open(ctx, cfg.Database)
	if err != nil {
		return nil, fmt.Errorf("gateway: store: %w", err)
	}
	cfg.Log.Info("store on PostgreSQL", "schema_version", pgstore.SchemaVersion())
	return st, nil
}
