package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	"github.com/better-compute/bcd/components/gateway/store/storetest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t testing.TB, url string) *pgstore.PG {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The shared suite on PostgreSQL: each test gets its own database;
// reopen connects again (a restarted bcgw).
func TestSuite(t *testing.T) {
	storetest.Run(t, func(t testing.TB) (store.Store, func() store.Store) {
		url := pgtest.Database(t)
		var last store.Store = open(t, url)
		t.Cleanup(func() { last.Close() })
		return last, func() store.Store {
			last = open(t, url)
			return last
		}
	})
}

// Open brings an empty database to the schema version, records it, and
// opening again applies nothing twice.
func TestMigrations(t *testing.T) {
	url := pgtest.Database(t)
	ctx := context.Background()
	for range 2 {
		open(t, url).Close()
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, max int
	if err := conn.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != pgstore.SchemaVersion() || max != pgstore.SchemaVersion() || n < 1 {
		t.Errorf("schema_migrations has %d rows up to %d, want %d", n, max, pgstore.SchemaVersion())
	}
	// A newer bcgw migrated this database: this one refuses it and says why.
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'future.sql')`, pgstore.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Open(ctx, url)
	if !errors.Is(err, pgstore.ErrSchemaNewer) || !strings.Contains(err.Error(), "newer") {
		t.Errorf("open of a newer schema: %v", err)
	}
}

// Gateways starting together on an empty database all open it, and it
// is migrated once.
func TestManyGatewaysOnOneDatabase(t *testing.T) {
	url := pgtest.Database(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			s, err := pgstore.Open(context.Background(), url)
			if err == nil {
				t.Cleanup(func() { s.Close() })
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("open: %v", err)
		}
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n != pgstore.SchemaVersion() {
		t.Errorf("schema_migrations: %d rows %v, want %d", n, err, pgstore.SchemaVersion())
	}
}

// The shared cases: two stores on one database, as two gateways.
func TestSharedSuite(t *testing.T) {
	storetest.RunShared(t, func(t testing.TB) (store.Store, store.Store) {
		url := pgtest.Database(t)
		a, b := open(t, url), open(t, url)
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	})
}

// A password in the URL reaches no error message.
func TestErrorsHidePassword(t *testing.T) {
	const pw = "hunter2-secret"
	for _, url := range []string{
		"postgres://bcgw:" + pw + "@127.0.0.1:1/x?sslmode=disable&connect_timeout=2",
		"postgres://bcgw:" + pw + "@127.0.0.1:1/x?sslmode=bogus",
	} {
		_, err := pgstore.Open(context.Background(), url)
		if err == nil {
			t.Fatalf("open of %s succeeded", strings.ReplaceAll(url, pw, "***"))
		}
		if strings.Contains(err.Error(), pw) {
			t.Errorf("error carries the password: %v", err)
		}
	}
}

// BenchmarkStore: the shared benchmarks on a cluster that syncs every
// commit (make bench prints them under the bbolt figures of the same run).
func BenchmarkStore(b *testing.B) {
	c, err := pgtest.StartDurable()
	if errors.Is(err, pgtest.ErrNoPostgres) {
		testenv.Skip(b, "%v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer c.Stop()
	storetest.Bench(b, func(t testing.TB) (store.Store, func() store.Store) {
		url, err := c.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		s := open(t, url)
		t.Cleanup(func() { s.Close() })
		return s, nil
	})
}

// A read-modify-write that writes nothing (an ack of a command already
// delivered) or fails (an unknown command) ends its transaction and gives
// its connection back to the pool, row lock released: the pool opens no
// connection for the next call, and a writer of the row is not blocked.
func TestNoWriteKeepsConnection(t *testing.T) {
	s := open(t, pgtest.Database(t))
	defer s.Close()
	if err := s.PutNode(store.Node{ID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddCommand(store.Command{ID: "c1", NodeID: "n1", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered("n1", "c1"); err != nil {
		t.Fatal(err)
	}
	before := s.PoolStats().NewConns
	for range 20 {
		if err := s.MarkDelivered("n1", "c1"); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkDelivered("n1", "nope"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("ack of an unknown command: %v", err)
		}
		if _, err := s.UpdateNode("n1", func(*store.Node) error { return errors.New("no") }); err == nil {
			t.Fatal("a failing update succeeded")
		}
	}
	if opened := s.PoolStats().NewConns - before; opened > 2 {
		t.Errorf("the pool opened %d connections for 60 calls that wrote nothing", opened)
	}
	if _, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatalf("result after the acks: %v", err)
	}
}

// statements records every statement each connection ran, in order (a
// pgx query and batch tracer).
type statements struct {
	mu  sync.Mutex
	run map[*pgx.Conn][]string
}

func (s *statements) add(c *pgx.Conn, sql string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.run[c] = append(s.run[c], sql)
}

func (s *statements) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	s.add(c, d.SQL)
	return ctx
}
func (s *statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (s *statements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (s *statements) TraceBatchQuery(_ context.Context, c *pgx.Conn, d pgx.TraceBatchQueryData) {
	s.add(c, d.SQL)
}
func (s *statements) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A notice is never sent inside the transaction whose writes it tells
// of, and its own transaction does not wait for its flush: PostgreSQL
// holds one database-wide lock from a notifying transaction's commit
// until its flush, so notices sent with the writes made every session
// set-up, command and result wait for the ones before them to reach the
// disk (notify.go).
func TestNoticesAfterCommit(t *testing.T) {
	tr := &statements{run: map[*pgx.Conn][]string{}}
	s, err := pgstore.OpenTraced(context.Background(), pgtest.Database(t), tr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutNode(store.Node{ID: "n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.StartSession("n1", func(*store.Node) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "c2"} {
		if err := s.AddCommand(store.Command{ID: id, NodeID: "n1", Kind: "k"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetResult("n1", "c1", store.Result{Status: "SUCCEEDED"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CancelPending("c2", "stop", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.Notify(store.Notice{Kind: store.NoticeTrust}); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	notices := 0
	for _, run := range tr.run {
		inTx := false
		for i, q := range run {
			l := strings.ToLower(strings.TrimSpace(q))
			switch {
			case strings.HasPrefix(l, "begin"):
				inTx = true
			case l == "commit" || l == "rollback":
				inTx = false
			case strings.Contains(l, "pg_notify"):
				notices++
				if inTx {
					t.Errorf("a notice sent inside a transaction with writes: %q after %q", q, run[max(0, i-3):i])
				}
				if !strings.Contains(l, "set_config('synchronous_commit', 'off', true)") {
					t.Errorf("a notice whose commit waits for its flush: %q", q)
				}
			}
		}
	}
	if notices != 6 {
		t.Errorf("%d notices sent, want 6 (session, two commands, result, cancel, trust)", notices)
	}
}
