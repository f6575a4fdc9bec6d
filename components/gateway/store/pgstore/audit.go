package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store"
)

// RecentCommands lists the newest commands, newest first, at most limit.
func (p *PG) RecentCommands(limit int) ([]store.Command, error) {
	var out []store.Command
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.Command](ctx, tx, "command",
			`SELECT id, record FROM commands ORDER BY created_at DESC, id DESC LIMIT $1`, max(limit, 0))
		return err
	})
	// The record's time keeps nanoseconds; the column only microseconds.
	store.SortNewest(out)
	return out, err
}

// Tokens lists the join tokens by id.
func (p *PG) Tokens() ([]store.Token, error) {
	var out []store.Token
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.Token](ctx, tx, "token", `SELECT id, record FROM tokens`)
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// DeleteNode forgets a node; its commands, spec, report and events go
// with it (ON DELETE CASCADE).
func (p *PG) DeleteNode(id string) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1`, id)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
		}
		return nil
	})
}

// AddAudit appends an audit entry; its seq is the table's next.
func (p *PG) AddAudit(e store.AuditEntry) (store.AuditEntry, error) {
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence('audit', 'seq'))`).Scan(&e.Seq); err != nil {
			return err
		}
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO audit (seq, record) VALUES ($1, $2)`, int64(e.Seq), b)
		return err
	})
	return e, err
}

// Audit lists the entries after seq after, oldest first, at most limit.
func (p *PG) Audit(after uint64, limit int) ([]store.AuditEntry, error) {
	if after > math.MaxInt64 {
		return nil, nil
	}
	lim := any(nil) // LIMIT NULL: no limit
	if limit > 0 {
		lim = limit
	}
	var out []store.AuditEntry
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.AuditEntry](ctx, tx, "audit entry",
			`SELECT seq::text, record FROM audit WHERE seq > $1 ORDER BY seq LIMIT $2`, int64(after), lim)
		return err
	})
	return out, err
}
