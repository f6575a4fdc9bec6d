package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store"
)

var _ store.KeyStore = (*PG)(nil)

// Keys reads the stored key set and the fingerprint of the key-encryption
// key it is sealed under (tables gateway_kek and gateway_keys, one
// snapshot); store.ErrNotFound when none was stored.
func (p *PG) Keys() (string, []store.SealedKey, error) {
	var fp string
	var keys []store.SealedKey
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		keys = nil
		if err := tx.QueryRow(ctx, `SELECT fingerprint FROM gateway_kek`).Scan(&fp); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return store.ErrNotFound
			}
			return err
		}
		rows, err := tx.Query(ctx, `SELECT name, version, sealed FROM gateway_keys ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k store.SealedKey
			var v int32
			if err := rows.Scan(&k.Name, &v, &k.Sealed); err != nil {
				return err
			}
			if v <= 0 {
				return fmt.Errorf("key %s: version %d", k.Name, v)
			}
			k.Version = uint32(v)
			keys = append(keys, k)
		}
		return rows.Err()
	})
	// The fingerprint and the keys are committed together, so a
	// fingerprint seen means its keys are there for the next statement
	// (read committed takes a snapshot per statement). A key rotated
	// between the two reads (RotateKey) is read as stored after it: its
	// version and seal are one row.
	return fp, keys, err
}

// AddKeysIfAbsent writes the fingerprint row and then the keys in one
// transaction. The fingerprint row's primary key decides between gateways
// starting together: a second inserter waits on the first's uncommitted
// row, then finds it (ON CONFLICT DO NOTHING, no row) and writes nothing.
func (p *PG) AddKeysIfAbsent(fp string, keys []store.SealedKey) (bool, error) {
	if fp == "" || len(keys) == 0 {
		return false, errors.New("add keys: no fingerprint or no keys")
	}
	var added bool
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		added = false
		tag, err := tx.Exec(ctx, `INSERT INTO gateway_kek (one, fingerprint) VALUES (true, $1) ON CONFLICT (one) DO NOTHING`, fp)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		for _, k := range keys {
			if k.Version == 0 || k.Version > 1<<31-1 {
				return fmt.Errorf("key %s: version %d", k.Name, k.Version)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO gateway_keys (name, version, sealed) VALUES ($1, $2, $3)`, k.Name, int32(k.Version), k.Sealed); err != nil {
				return fmt.Errorf("key %s: %w", k.Name, err)
			}
		}
		added = true
		return nil
	})
	return added, err
}

// ResealKeys swaps the fingerprint row while it still names old, then
// rewrites every key's seal, in one transaction.
func (p *PG) ResealKeys(old, fp string, keys []store.SealedKey) (bool, error) {
	if old == "" || fp == "" || len(keys) == 0 {
		return false, errors.New("reseal keys: no fingerprint or no keys")
	}
	var done bool
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		done = false
		tag, err := tx.Exec(ctx, `UPDATE gateway_kek SET fingerprint = $2, created_at = now() WHERE one AND fingerprint = $1`, old, fp)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil
		}
		var stored int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM gateway_keys`).Scan(&stored); err != nil {
			return err
		}
		if stored != len(keys) {
			return fmt.Errorf("reseal keys: %d keys given, %d stored", len(keys), stored)
		}
		for _, k := range keys {
			if k.Version == 0 || k.Version > 1<<31-1 {
				return fmt.Errorf("key %s: version %d", k.Name, k.Version)
			}
			tag, err := tx.Exec(ctx, `UPDATE gateway_keys SET sealed = $3 WHERE name = $1 AND version = $2`, k.Name, int32(k.Version), k.Sealed)
			if err != nil {
				return fmt.Errorf("key %s: %w", k.Name, err)
			}
			if tag.RowsAffected() != 1 {
				var stored bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM gateway_keys WHERE name = $1)`, k.Name).Scan(&stored); err != nil {
					return err
				}
				if !stored {
					return fmt.Errorf("reseal keys: %s is not stored", k.Name)
				}
				// Rotated since it was read (RotateKey): nothing of the
				// reseal stays.
				return errKeysMoved
			}
		}
		done = true
		return nil
	})
	if errors.Is(err, errKeysMoved) {
		return false, nil
	}
	return done, err
}

// errKeysMoved rolls back a change of the key set that found it changed.
var errKeysMoved = errors.New("the key set changed")

// RotateKey takes the gateway_kek row's lock first, as ResealKeys does,
// so a rotation and a reseal run one after the other: the later one finds
// the fingerprint or the key's version moved and changes nothing.
func (p *PG) RotateKey(fp string, next store.SealedKey, metaKey string, old, v []byte) (bool, error) {
	if fp == "" || next.Name == "" || next.Version < 2 || next.Version > 1<<31-1 || len(next.Sealed) == 0 || old == nil || len(v) == 0 {
		return false, errors.New("rotate key: no fingerprint, key, version after 1, or value")
	}
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE gateway_kek SET fingerprint = fingerprint WHERE one AND fingerprint = $1`, fp)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errKeysMoved
		}
		tag, err = tx.Exec(ctx, `UPDATE gateway_keys SET version = $2, sealed = $3 WHERE name = $1 AND version = $4`,
			next.Name, int32(next.Version), next.Sealed, int32(next.Version-1))
		if err != nil {
			return fmt.Errorf("key %s: %w", next.Name, err)
		}
		if tag.RowsAffected() == 0 {
			return errKeysMoved
		}
		tag, err = tx.Exec(ctx, `UPDATE meta SET value = $3 WHERE key = $1 AND value = $2`, metaKey, old, v)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errKeysMoved
		}
		return nil
	})
	if errors.Is(err, errKeysMoved) {
		return false, nil
	}
	return err == nil, err
}
