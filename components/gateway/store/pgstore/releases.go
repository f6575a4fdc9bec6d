package pgstore

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store"
)

var _ store.Releases = (*PG)(nil)

// PutRelease stores a release's document and binaries (store.Releases).
func (p *PG) PutRelease(version string, doc []byte, artifacts map[string][]byte) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		var old []byte
		err := tx.QueryRow(ctx, `INSERT INTO releases (version, doc) VALUES ($1, $2)
			ON CONFLICT (version) DO UPDATE SET version = EXCLUDED.version RETURNING doc`, version, doc).Scan(&old)
		if err != nil {
			return fmt.Errorf("store release %s: %w", version, err)
		}
		if !bytes.Equal(old, doc) {
			return fmt.Errorf("release %s: %w", version, store.ErrReleaseConflict)
		}
		for sum, b := range artifacts {
			if _, err := tx.Exec(ctx, `INSERT INTO release_artifacts (sha256, data) VALUES ($1, $2) ON CONFLICT (sha256) DO NOTHING`, sum, b); err != nil {
				return fmt.Errorf("store release %s artifact %s: %w", version, sum, err)
			}
		}
		return nil
	})
}

// Release returns a stored release document (store.Releases).
func (p *PG) Release(version string) ([]byte, error) {
	return p.bytesOf(`SELECT doc FROM releases WHERE version = $1`, version)
}

// ReleaseArtifact returns a stored release binary (store.Releases).
func (p *PG) ReleaseArtifact(sum string) ([]byte, error) {
	return p.bytesOf(`SELECT data FROM release_artifacts WHERE sha256 = $1`, sum)
}

func (p *PG) bytesOf(sql, key string) ([]byte, error) {
	var b []byte
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		err := tx.QueryRow(ctx, sql, key).Scan(&b)
		if err == pgx.ErrNoRows {
			return store.ErrNotFound
		}
		return err
	})
	return b, err
}

// ReleaseVersions lists the stored release versions (store.Releases).
func (p *PG) ReleaseVersions() ([]string, error) {
	var out []string
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		out = out[:0]
		rows, err := tx.Query(ctx, `SELECT version FROM releases ORDER BY version`)
		if err != nil {
			return err
		}
		vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		out = append(out, vs...)
		return err
	})
	return out, err
}
