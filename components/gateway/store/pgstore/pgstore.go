// Package pgstore keeps bcgw's store.Store in PostgreSQL, for a fleet:
// the same records as the bbolt store, in tables made by the SQL files in
// migrations/ (embedded, applied at Open, versioned in schema_migrations).
// Each method is one transaction; the exactly-once rules the bbolt store
// keeps by running one writer at a time are kept here with row locks
// (SELECT ... FOR UPDATE) and conditional writes (INSERT ... ON CONFLICT
// DO NOTHING, UPDATE ... WHERE generation = base), so they hold for any
// number of gateways on one database. docs/gateway-store.md has the
// schema and each rule in SQL.
package pgstore

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/bcd/components/gateway/store"
)

// opTimeout bounds one store call, so a database that stopped answering
// fails the call instead of hanging the gateway.
const opTimeout = 30 * time.Second

// PG is the Store on a PostgreSQL database. Any number of gateways may
// have one database open: the records' rules hold across them (row locks,
// conditional writes), notices reach them all through LISTEN/NOTIFY on
// the channel bcgw (notify.go), and leases are rows with an expiry.
type PG struct {
	pool *pgxpool.Pool
	// conn is the connection settings, for the listener's own connection.
	conn *pgx.ConnConfig

	// pingMu guards ping, the health check's own connection (not the
	// pool's: under load every pool connection can be taken for seconds,
	// and a ping queued behind them would call a busy database down).
	pingMu sync.Mutex
	ping   *pgx.Conn

	// unsent is told of a notice that failed after its writes committed.
	unsent atomic.Pointer[func(n store.Notice, err error)]
}

// PoolSize is the pool's size when the URL sets no pool_max_conns: a
// gateway that takes over thousands of sessions runs about six
// transactions for each, and PostgreSQL commits concurrent transactions
// with one flush, so more connections move more sessions a second (pgx's
// default is the core count, 4 here). Three gateways at 16 stay far from
// PostgreSQL's default max_connections of 100.
func PoolSize() int32 { return int32(max(16, 4*runtime.GOMAXPROCS(0))) }

// ErrUnreachable: the database did not answer (down, not there yet, or
// refusing this user); a caller may retry.
var ErrUnreachable = errors.New("database unreachable")

var _ store.Store = (*PG)(nil)

// Open connects to the database at url (a postgres:// URL or key=value
// string), brings its schema to this build's version and returns the
// store. It refuses a database whose schema is newer than this build
// knows. Errors name the host and database, never the password.
func Open(ctx context.Context, url string) (*PG, error) { return open(ctx, url, nil) }

// open is Open with a tracer of every statement (tests).
func open(ctx context.Context, url string, tracer pgx.QueryTracer) (*PG, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err) // pgconn redacts the password
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	where := fmt.Sprintf("postgres host=%s database=%s user=%s", cfg.ConnConfig.Host, cfg.ConnConfig.Database, cfg.ConnConfig.User)
	if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = PoolSize()
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w: %w", where, ErrUnreachable, err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: schema: %w", where, err)
	}
	return &PG{pool: pool, conn: cfg.ConnConfig.Copy()}, nil
}

// Close closes the connection pool and the ping's connection.
func (p *PG) Close() error {
	p.pool.Close()
	p.pingMu.Lock()
	if p.ping != nil {
		p.ping.Close(context.Background())
		p.ping = nil
	}
	p.pingMu.Unlock()
	return nil
}

// Ping checks that the database answers a query, on a connection of its
// own (made again after a failure), never waiting for one of the pool's.
func (p *PG) Ping(ctx context.Context) error {
	p.pingMu.Lock()
	defer p.pingMu.Unlock()
	err := p.pingOnce(ctx)
	if err != nil {
		if p.ping != nil {
			p.ping.Close(context.Background())
			p.ping = nil
		}
		return fmt.Errorf("ping postgres host=%s database=%s: %w", p.conn.Host, p.conn.Database, err)
	}
	return nil
}

func (p *PG) pingOnce(ctx context.Context) error {
	if p.ping == nil {
		c, err := pgx.ConnectConfig(ctx, p.conn)
		if err != nil {
			return err
		}
		p.ping = c
	}
	return p.ping.Ping(ctx)
}

// PoolStats are the pool's figures: its size, the connections taken, and
// how often and how long a call waited for one (bcgw's metrics).
type PoolStats struct {
	Max, Acquired int32
	Waits         int64
	WaitTime      time.Duration
	// NewConns is how many connections the pool opened so far.
	NewConns int64
}

// PoolStats reads the pool's figures now.
func (p *PG) PoolStats() PoolStats {
	st := p.pool.Stat()
	return PoolStats{Max: st.MaxConns(), Acquired: st.AcquiredConns(), Waits: st.EmptyAcquireCount(),
		WaitTime: st.EmptyAcquireWaitTime(), NewConns: st.NewConnsCount()}
}

// tx runs fn in one transaction (read committed; the rows a method must
// own it locks itself) and commits when fn returns nil.
func (p *PG) tx(fn func(ctx context.Context, tx pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return pgx.BeginTxFunc(ctx, p.pool, pgx.TxOptions{}, func(tx pgx.Tx) error { return fn(ctx, tx) })
}

// read runs fn's reads without a transaction of their own: a single
// statement is atomic by itself, and sent alone it costs one round trip
// where BEGIN, the statement and COMMIT cost three.
func (p *PG) read(fn func(ctx context.Context, q querier) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return fn(ctx, p.pool)
}

// querier is a transaction or the pool (a statement of its own).
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// record reads one JSON record column into v; ErrNotFound without a row.
func record(ctx context.Context, q querier, v any, sql string, args ...any) error {
	var b []byte
	if err := q.QueryRow(ctx, sql, args...).Scan(&b); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		return err
	}
	return json.Unmarshal(b, v)
}

// records reads the (id, record) rows sql selects, each record's JSON
// into a T; what names the kind in an error ("node", "command").
func records[T any](ctx context.Context, q querier, what, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var id string
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, id, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func nodeExists(ctx context.Context, tx pgx.Tx, id string) error {
	var ok bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nodes WHERE id = $1)`, id).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	return nil
}

// lockNode takes the node's row lock for the rest of the transaction
// (FOR NO KEY UPDATE: inserts referencing the node still go on), or
// ErrNotFound.
func lockNode(ctx context.Context, tx pgx.Tx, id string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM nodes WHERE id = $1 FOR NO KEY UPDATE`, id).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("node %s: %w", id, store.ErrNotFound)
	}
	return err
}

// ---- tokens ----

// PutToken stores a token record (replacing one with its id).
func (p *PG) PutToken(t store.Token) error {
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO tokens (id, record) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET record = excluded.record`, t.ID, b)
		return err
	})
}

// DeleteToken removes a token record.
func (p *PG) DeleteToken(id string) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM tokens WHERE id = $1`, id)
		return err
	})
}

// SpendToken checks and uses a token once (store.Bolt.SpendToken).
func (p *PG) SpendToken(id, secret, role string, now time.Time) (store.Token, error) {
	return p.SpendTokenIf(id, secret, role, now, nil)
}

// SpendTokenIf checks the token under its row lock and counts the use in
// the same transaction: two spenders of the last use queue on the lock,
// and the second sees it spent.
func (p *PG) SpendTokenIf(id, secret, role string, now time.Time, check func(store.Token) error) (store.Token, error) {
	var t store.Token
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		if err := record(ctx, tx, &t, `SELECT record FROM tokens WHERE id = $1 FOR UPDATE`, id); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return store.ErrTokenInvalid
			}
			return err
		}
		if subtle.ConstantTimeCompare([]byte(t.Hash), []byte(store.HashSecret(secret))) != 1 {
			return store.ErrTokenInvalid
		}
		if !t.ExpiresAt.IsZero() && now.After(t.ExpiresAt) {
			return store.ErrTokenExpired
		}
		if t.Used >= t.Uses {
			return store.ErrTokenSpent
		}
		if t.Role != role {
			return store.ErrTokenRole
		}
		if check != nil {
			if err := check(t); err != nil {
				return err
			}
		}
		t.Used++
		b, err := json.Marshal(t)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE tokens SET record = $2 WHERE id = $1`, id, b)
		return err
	})
	return t, err
}

// ---- nodes ----

// PutNode creates or replaces a node record.
func (p *PG) PutNode(n store.Node) error {
	b, err := json.Marshal(n)
	if err != nil {
		return err
	}
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO nodes (id, record) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET record = excluded.record`, n.ID, b)
		return err
	})
}

// Node returns one node.
func (p *PG) Node(id string) (store.Node, error) {
	var n store.Node
	err := p.read(func(ctx context.Context, q querier) error {
		return record(ctx, q, &n, `SELECT record FROM nodes WHERE id = $1`, id)
	})
	return n, err
}

// Nodes lists every node by id (bytewise, as the bbolt store orders them).
func (p *PG) Nodes() ([]store.Node, error) {
	var out []store.Node
	err := p.tx(func(ctx context.Context, tx pgx.Tx) (err error) {
		out, err = records[store.Node](ctx, tx, "node", `SELECT id, record FROM nodes`)
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// UpdateNode applies f to the node under its row lock.
func (p *PG) UpdateNode(id string, f func(*store.Node) error) (store.Node, error) {
	return p.updateNode(id, f, nil)
}

// updateNode applies f to the node under its row lock, and sends the
// notice notice makes of the new record once it is committed (nil: none; notify.go).
func (p *PG) updateNode(id string, f func(*store.Node) error, notice func(store.Node) store.Notice) (store.Node, error) {
	var n store.Node
	err := p.rmw(`SELECT record FROM nodes WHERE id = $1 FOR NO KEY UPDATE`, []any{id}, func(rec []byte, found bool) (*writes, error) {
		n = store.Node{}
		if !found {
			return nil, store.ErrNotFound
		}
		if err := json.Unmarshal(rec, &n); err != nil {
			return nil, err
		}
		if err := f(&n); err != nil {
			return nil, err
		}
		b, err := json.Marshal(n)
		if err != nil {
			return nil, err
		}
		w := &writes{}
		w.Queue(`UPDATE nodes SET record = $2 WHERE id = $1`, id, b)
		if notice != nil {
			x := notice(n)
			w.notice = &x
		}
		return w, nil
	})
	return n, err
}

// StartSession takes the node's next epoch and applies f under the
// node's row lock, and sends the session notice once committed (notify.go): one
// transaction where the epoch, the session's record and the notice were
// three.
func (p *PG) StartSession(nodeID string, f func(*store.Node) error) (store.Node, error) {
	return p.updateNode(nodeID, func(n *store.Node) error {
		n.Epoch++
		return f(n)
	}, func(n store.Node) store.Notice {
		// An older session of the node on another gateway (half-open,
		// its agent gone) ends there.
		return store.Notice{Kind: store.NoticeSession, Node: nodeID, Epoch: n.Epoch}
	})
}

// SessionState reads the node's report, unfinished commands and spec in
// one round trip: the two statements go out in one batch, which
// PostgreSQL runs as one implicit transaction.
func (p *PG) SessionState(nodeID string) (store.SessionState, error) {
	var st store.SessionState
	err := p.read(func(ctx context.Context, _ querier) error {
		b := &pgx.Batch{}
		b.Queue(`SELECT EXISTS (SELECT 1 FROM nodes WHERE id = $1),
			(SELECT record FROM reports WHERE node_id = $1), (SELECT record FROM specs WHERE node_id = $1)`, nodeID)
		b.Queue(unfinishedSQL, nodeID)
		br := p.pool.SendBatch(ctx, b)
		var known bool
		var spec []byte
		err := br.QueryRow().Scan(&known, &st.Report, &spec)
		if err == nil && !known {
			err = fmt.Errorf("node %s: %w", nodeID, store.ErrNotFound)
		}
		if err == nil && len(spec) > 0 {
			err = json.Unmarshal(spec, &st.Spec)
		}
		if err == nil {
			st.Unfinished, err = collectCommands(br)
		}
		return errors.Join(err, br.Close())
	})
	if err != nil {
		return store.SessionState{}, err
	}
	st.Report = nilIfEmpty(st.Report)
	sortCommands(st.Unfinished)
	return st, nil
}

// collectCommands reads a batch's next result, (id, record) rows of
// commands.
func collectCommands(br pgx.BatchResults) ([]store.Command, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Command
	for rows.Next() {
		var id string
		var b []byte
		if err := rows.Scan(&id, &b); err != nil {
			return nil, err
		}
		var c store.Command
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("command %s: %w", id, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// ---- commands ----

// AddCommand stores a new pending command; its id is the primary key, so
// of two adds of one id exactly one is stored.
func (p *PG) AddCommand(c store.Command) error {
	c.State = store.StatePending
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	err = p.tx(func(ctx context.Context, tx pgx.Tx) error {
		if err := nodeExists(ctx, tx, c.NodeID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `INSERT INTO commands (id, node_id, state, created_at, record)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, c.ID, c.NodeID, c.State, c.CreatedAt, b)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("command %s already exists", c.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// To every gateway, once committed (notify.go): the one holding the
	// node's session sends the command.
	p.sendNotice(store.Notice{Kind: store.NoticeCommand, Node: c.NodeID, Command: c.ID})
	return nil
}

// Command returns one command.
func (p *PG) Command(id string) (store.Command, error) {
	var c store.Command
	err := p.read(func(ctx context.Context, q querier) error {
		return record(ctx, q, &c, `SELECT record FROM commands WHERE id = $1`, id)
	})
	return c, err
}

// Unfinished lists a node's commands without a result, oldest first.
func (p *PG) Unfinished(nodeID string) ([]store.Command, error) {
	var out []store.Command
	err := p.read(func(ctx context.Context, q querier) (err error) {
		out, err = records[store.Command](ctx, q, "command", unfinishedSQL, nodeID)
		return err
	})
	sortCommands(out)
	return out, err
}

const unfinishedSQL = `SELECT id, record FROM commands WHERE node_id = $1 AND state <> 'done'`

// sortCommands orders commands oldest first (the record's time keeps
// nanoseconds; the column only microseconds), then by id.
func sortCommands(cs []store.Command) {
	sort.Slice(cs, func(i, j int) bool {
		if !cs[i].CreatedAt.Equal(cs[j].CreatedAt) {
			return cs[i].CreatedAt.Before(cs[j].CreatedAt)
		}
		return cs[i].ID < cs[j].ID
	})
}

// updateCommand locks a command's row, lets f change it (f returns false
// to leave it as it is) and writes it back with its state column.
func updateCommand(ctx context.Context, tx pgx.Tx, id string, f func(*store.Command) (bool, error)) (store.Command, error) {
	var c store.Command
	if err := record(ctx, tx, &c, `SELECT record FROM commands WHERE id = $1 FOR UPDATE`, id); err != nil {
		return c, err
	}
	write, err := f(&c)
	if err != nil || !write {
		return c, err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return c, err
	}
	_, err = tx.Exec(ctx, `UPDATE commands SET state = $2, record = $3 WHERE id = $1`, id, c.State, b)
	return c, err
}

// updateCommandRMW is updateCommand as a transaction of its own in two
// round trips (rmw); notice, when f wrote and it is not nil, makes the
// notice sent once committed (nil: none; notify.go).
func (p *PG) updateCommandRMW(id string, f func(*store.Command) (bool, error), notice func(store.Command) *store.Notice) error {
	return p.rmw(`SELECT record FROM commands WHERE id = $1 FOR UPDATE`, []any{id}, func(rec []byte, found bool) (*writes, error) {
		if !found {
			return nil, store.ErrNotFound
		}
		var c store.Command
		if err := json.Unmarshal(rec, &c); err != nil {
			return nil, err
		}
		write, err := f(&c)
		if err != nil || !write {
			return nil, err
		}
		b, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		w := &writes{notice: notice(c)}
		w.Queue(`UPDATE commands SET state = $2, record = $3 WHERE id = $1`, id, c.State, b)
		return w, nil
	})
}

// MarkDelivered records that the agent acked receipt of a command.
func (p *PG) MarkDelivered(nodeID, id string) error {
	return p.updateCommandRMW(id, func(c *store.Command) (bool, error) {
		if c.NodeID != nodeID || c.State != store.StatePending {
			return false, nil
		}
		c.State = store.StateDelivered
		return true, nil
	}, func(store.Command) *store.Notice { return nil })
}

// SetResult stores a command's first result and counts every copy; the
// command's row lock makes "first" true for exactly one caller.
func (p *PG) SetResult(nodeID, id string, r store.Result) (bool, error) {
	first := false
	err := p.updateCommandRMW(id, func(c *store.Command) (bool, error) {
		first = false
		if c.NodeID != nodeID {
			return false, fmt.Errorf("command %s is not for node %s", id, nodeID)
		}
		c.ResultCopies++
		if c.Result == nil {
			first = true
			c.Result, c.State = &r, store.StateDone
		}
		return true, nil
	}, func(store.Command) *store.Notice {
		if !first {
			return nil
		}
		// Wakes whoever waits for this result, on any gateway.
		return &store.Notice{Kind: store.NoticeResult, Node: nodeID, Command: id}
	})
	return first && err == nil, err
}

// CancelPending ends a command not yet acked with a CANCELLED result.
func (p *PG) CancelPending(id, reason string, now time.Time) (store.Command, bool, error) {
	var c store.Command
	done := false
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		done = false
		var err error
		c, err = updateCommand(ctx, tx, id, func(c *store.Command) (bool, error) {
			if c.State != store.StatePending {
				return false, nil
			}
			c.Result = &store.Result{Status: "CANCELLED", Error: reason, StartedMS: now.UnixMilli(), FinishedMS: now.UnixMilli()}
			c.State, done = store.StateDone, true
			return true, nil
		})
		return err
	})
	if done && err == nil {
		p.sendNotice(store.Notice{Kind: store.NoticeResult, Node: c.NodeID, Command: id})
	}
	return c, done && err == nil, err
}

// ---- meta ----

// Meta reads a small value of the gateway's own (nil when absent).
func (p *PG) Meta(key string) ([]byte, error) {
	var out []byte
	err := p.read(func(ctx context.Context, q querier) error {
		err := q.QueryRow(ctx, `SELECT value FROM meta WHERE key = $1`, key).Scan(&out)
		if errors.Is(err, pgx.ErrNoRows) {
			out = nil
			return nil
		}
		return err
	})
	return nilIfEmpty(out), err
}

// SetMeta writes a small value of the gateway's own.
func (p *PG) SetMeta(key string, v []byte) error {
	if v == nil {
		v = []byte{}
	}
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ($1, $2)
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`, key, v)
		return err
	})
}

// SwapMeta sets key to v while its value is old: with old nil an insert
// that a present row turns into nothing (ON CONFLICT DO NOTHING), else an
// UPDATE whose WHERE compares the value. A second writer from the same
// old value waits on the first's row lock, re-checks WHERE against the
// committed row and updates nothing.
func (p *PG) SwapMeta(key string, old, v []byte) (bool, error) {
	if v == nil {
		v = []byte{}
	}
	var swapped bool
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		var tag pgconn.CommandTag
		var err error
		if old == nil {
			tag, err = tx.Exec(ctx, `INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`, key, v)
		} else {
			tag, err = tx.Exec(ctx, `UPDATE meta SET value = $3 WHERE key = $1 AND value = $2`, key, old, v)
		}
		swapped = err == nil && tag.RowsAffected() == 1
		return err
	})
	return swapped, err
}

// DeleteMeta deletes one value.
func (p *PG) DeleteMeta(key string) error {
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM meta WHERE key = $1`, key)
		return err
	})
}

// nilIfEmpty answers an empty value as nil, as the bbolt store does
// (callers test a value against nil).
func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// prefixRange is the SQL condition and arguments selecting the keys that
// start with prefix: the key range [prefix, successor) under collation C,
// where successor increments prefix's last code point.
func prefixRange(prefix string) (string, []any) {
	if prefix == "" {
		return "TRUE", nil
	}
	r := []rune(prefix)
	for len(r) > 0 {
		last := r[len(r)-1] + 1
		if last == 0xD800 {
			last = 0xE000 // surrogates are not characters
		}
		if last <= utf8.MaxRune {
			r[len(r)-1] = last
			return "key >= $1 AND key < $2", []any{prefix, string(r)}
		}
		r = r[:len(r)-1]
	}
	return "key >= $1", []any{prefix}
}

// MetaPrefix returns every value whose key starts with prefix.
func (p *PG) MetaPrefix(prefix string) (map[string][]byte, error) {
	out := map[string][]byte{}
	cond, args := prefixRange(prefix)
	err := p.tx(func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT key, value FROM meta WHERE `+cond, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			var v []byte
			if err := rows.Scan(&k, &v); err != nil {
				return err
			}
			out[k] = nilIfEmpty(v)
		}
		return rows.Err()
	})
	return out, err
}

// DeleteMetaPrefix deletes every value whose key starts with prefix.
func (p *PG) DeleteMetaPrefix(prefix string) error {
	cond, args := prefixRange(prefix)
	return p.tx(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM meta WHERE `+cond, args...)
		return err
	})
}

// ---- desired spec ----

// ---- status reports ----

// ---- events ----
