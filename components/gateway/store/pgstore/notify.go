package pgstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store"
)

// channel is the LISTEN/NOTIFY channel of bcgw's notices.
const channel = "bcgw"

var _ store.Shared = (*PG)(nil)

// maxNotice is PostgreSQL's bound on a notice's payload (under 8000
// bytes).
const maxNotice = 7999

// notify queues a notice in tx: PostgreSQL delivers it to every listener
// when tx commits, and never when it rolls back. It is encoded without
// HTML escapes, which would grow a progress detail of 4 KiB past the
// bound.
func notify(ctx context.Context, tx pgx.Tx, n store.Notice) error {
	b, err := noticePayload(n)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, b)
	return err
}

// noticePayload is a notice as it travels.
func noticePayload(n store.Notice) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(n); err != nil {
		return "", err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > maxNotice {
		return "", fmt.Errorf("a %s notice of %d bytes, more than PostgreSQL carries (%d)", n.Kind, len(b), maxNotice)
	}
	return string(b), nil
}

// Notify sends a notice to every gateway on the database.
func (p *PG) Notify(n store.Notice) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error { return notify(ctx, tx, n) })
}

// Listen listens on its own connection (not the pool's: LISTEN belongs to
// a session) and calls f with each notice until ctx ends (nil) or the
// connection fails (the error; the caller listens again). synced is called
// once the LISTEN is in place.
func (p *PG) Listen(ctx context.Context, f func(store.Notice), synced func()) error {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	conn, err := pgx.ConnectConfig(cctx, p.conn)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen: connect: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `LISTEN `+channel); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen: %w", err)
	}
	if synced != nil {
		synced()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("listen: %w", err)
		}
		var x store.Notice
		if json.Unmarshal([]byte(n.Payload), &x) != nil || x.Kind == "" {
			continue // not one of ours
		}
		f(x)
	}
}

// Pending lists commands no node has acked yet, oldest first.
func (p *PG) Pending(nodes []string, limit int) ([]store.Command, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	var out []store.Command
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.Command](ctx, tx, "command", `SELECT id, record FROM commands
			WHERE state = 'pending' AND node_id = ANY($2) ORDER BY created_at, id LIMIT $1`, limit, nodes)
		return err
	})
	return out, err
}

// TouchLease decides the lease under its row lock: the row is made free
// (expired) when missing, then locked, so of two gateways touching a free
// lease at once exactly one grants it.
func (p *PG) TouchLease(name, holder string, now time.Time, ttl time.Duration) (held bool, until time.Time, changed bool, err error) {
	err = p.tx(func(ctx context.Context, tx pgx.Tx) error {
		held, until, changed = false, time.Time{}, false
		if _, err := tx.Exec(ctx, `INSERT INTO leases (name, holder, expires) VALUES ($1, '', 'epoch')
			ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return err
		}
		var cur string
		var exp time.Time
		if err := tx.QueryRow(ctx, `SELECT holder, expires FROM leases WHERE name = $1 FOR UPDATE`, name).Scan(&cur, &exp); err != nil {
			return err
		}
		switch {
		case cur == "" || now.After(exp):
			changed = cur != holder
		case cur != holder:
			return nil
		}
		held, until = true, now.Add(ttl)
		_, err := tx.Exec(ctx, `UPDATE leases SET holder = $2, expires = $3 WHERE name = $1`, name, holder, until)
		return err
	})
	if err != nil {
		return false, time.Time{}, false, err
	}
	return held, until, changed, nil
}

// LeaseHolder returns the lease's holder at now ("" when free or expired).
func (p *PG) LeaseHolder(name string, now time.Time) (string, error) {
	var h string
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		var exp time.Time
		err := tx.QueryRow(ctx, `SELECT holder, expires FROM leases WHERE name = $1`, name).Scan(&h, &exp)
		if err == pgx.ErrNoRows || (err == nil && now.After(exp)) {
			h = ""
			return nil
		}
		return err
	})
	return h, err
}
