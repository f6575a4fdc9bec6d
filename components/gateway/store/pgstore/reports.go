package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Spec returns a node's desired spec (generation 0 without one).
func (p *PG) Spec(nodeID string) (store.Spec, error) {
	var sp store.Spec
	err := p.read(func(ctx context.Context, q querier) error {
		var known bool
		var b []byte
		if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE id = $1), (SELECT record FROM specs WHERE node_id = $1)`,
			nodeID).Scan(&known, &b); err != nil {
			return err
		}
		if !known {
			return fmt.Errorf("node %s: %w", nodeID, store.ErrNotFound)
		}
		if len(b) == 0 {
			return nil
		}
		return json.Unmarshal(b, &sp)
	})
	if err != nil {
		return store.Spec{}, err
	}
	return sp, nil
}

// PutSpec writes generation base+1 if the stored one is still base.
func (p *PG) PutSpec(nodeID string, base uint64, spec []byte, at time.Time) (store.Spec, error) {
	return p.putSpec(nodeID, base, store.Spec{Spec: spec, UpdatedAt: at})
}

// PutSubmittedSpec is PutSpec for a submitted spec with its signature.
func (p *PG) PutSubmittedSpec(nodeID string, base uint64, spec, sig []byte, at time.Time) (store.Spec, error) {
	return p.putSpec(nodeID, base, store.Spec{Spec: spec, UpdatedAt: at, Submitted: true, Signature: sig})
}

// putSpec is the compare-and-swap on the generation: base 0 inserts the
// node's first row (ON CONFLICT DO NOTHING: a row means another writer
// won), any other base updates WHERE generation = base (a writer queued
// on the row lock re-checks the condition on the committed row). No row
// written means the generation moved.
func (p *PG) putSpec(nodeID string, base uint64, next store.Spec) (store.Spec, error) {
	sp := next
	sp.Generation, sp.Spec = base+1, append([]byte(nil), next.Spec...)
	if len(next.Signature) > 0 {
		sp.Signature = append([]byte(nil), next.Signature...)
	}
	if sp.Generation > 1<<63-1 {
		return store.Spec{}, fmt.Errorf("%w: base %d is beyond any stored generation", store.ErrGenerationMoved, base)
	}
	b, err := json.Marshal(sp)
	if err != nil {
		return store.Spec{}, err
	}
	err = p.tx(func(ctx context.Context, tx pgx.Tx) error {
		if err := nodeExists(ctx, tx, nodeID); err != nil {
			return err
		}
		var tag pgconn.CommandTag
		var err error
		if base == 0 {
			tag, err = tx.Exec(ctx, `INSERT INTO specs (node_id, generation, record) VALUES ($1, 1, $2)
				ON CONFLICT (node_id) DO NOTHING`, nodeID, b)
		} else {
			tag, err = tx.Exec(ctx, `UPDATE specs SET generation = $2 + 1, record = $3
				WHERE node_id = $1 AND generation = $2`, nodeID, int64(base), b)
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		var cur int64
		if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT generation FROM specs WHERE node_id = $1), 0)`, nodeID).Scan(&cur); err != nil {
			return err
		}
		return fmt.Errorf("%w: %d, not %d", store.ErrGenerationMoved, cur, base)
	})
	if err != nil {
		return store.Spec{}, err
	}
	return sp, nil
}

// PutReport replaces a node's latest status report record.
func (p *PG) PutReport(nodeID string, rec []byte) error {
	if rec == nil {
		rec = []byte{}
	}
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		if err := nodeExists(ctx, tx, nodeID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO reports (node_id, record) VALUES ($1, $2)
			ON CONFLICT (node_id) DO UPDATE SET record = excluded.record`, nodeID, rec)
		return err
	})
}

// Report returns a node's latest status report record, nil when none.
func (p *PG) Report(nodeID string) ([]byte, error) {
	var out []byte
	err := p.read(func(ctx context.Context, q querier) error {
		err := q.QueryRow(ctx, `SELECT record FROM reports WHERE node_id = $1`, nodeID).Scan(&out)
		if errors.Is(err, pgx.ErrNoRows) {
			out = nil
			return nil
		}
		return err
	})
	return nilIfEmpty(out), err
}

// seqArg passes a uint64 seq as text for a numeric(20) column.
func seqArg(seq uint64) string { return strconv.FormatUint(seq, 10) }

// AddEvent stores an event once per (node, seq) and keeps the keep of
// highest seq. The node's row lock orders a node's event writes, so the
// prune and the answer see every earlier write.
func (p *PG) AddEvent(nodeID string, e store.Event, keep int) (bool, error) {
	keep = max(keep, 0)
	b, err := json.Marshal(e)
	if err != nil {
		return false, err
	}
	stored := false
	err = p.tx(func(ctx context.Context, tx pgx.Tx) error {
		stored = false
		if err := lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO events (node_id, seq, record) VALUES ($1, $2::text::numeric, $3)
			ON CONFLICT (node_id, seq) DO NOTHING`, nodeID, seqArg(e.Seq), b)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		// Drop the (keep+1)-th highest seq and every lower one.
		if _, err := tx.Exec(ctx, `DELETE FROM events WHERE node_id = $1 AND seq <= (
				SELECT seq FROM events WHERE node_id = $1 ORDER BY seq DESC OFFSET $2 LIMIT 1)`, nodeID, keep); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM events WHERE node_id = $1 AND seq = $2::text::numeric)`,
			nodeID, seqArg(e.Seq)).Scan(&stored)
	})
	return stored && err == nil, err
}

// Events lists a node's events with a seq above after, oldest first.
func (p *PG) Events(nodeID string, after uint64) ([]store.Event, error) {
	out := []store.Event{}
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		out = out[:0]
		if err := nodeExists(ctx, tx, nodeID); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT record FROM events WHERE node_id = $1 AND seq > $2::text::numeric ORDER BY seq`,
			nodeID, seqArg(after))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				return err
			}
			var e store.Event
			if err := json.Unmarshal(b, &e); err != nil {
				return fmt.Errorf("event of %s: %w", nodeID, err)
			}
			out = append(out, e)
		}
		return rows.Err()
	})
	return out, err
}

// DeleteEvents forgets a node's events.
func (p *PG) DeleteEvents(nodeID string) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM events WHERE node_id = $1`, nodeID)
		return err
	})
}
