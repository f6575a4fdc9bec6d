package gateway_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// A database that is not there yet is waited for, each failed attempt
// logged with what was dialled; the gateway starts once it answers. A
// start given up (ctx ended) returns the last error.
func TestStoreWaitsForDatabase(t *testing.T) {
	c := pgtest.StartT(t)

	var logs lockedBuf
	kekFile, _ := writeKEK(t)
	cfg := gateway.Config{DataDir: filepath.Join(t.TempDir(), "gw"), Listen: "127.0.0.1:0", Database: c.URL("later"), KEKFile: kekFile,
		Log: slog.New(slog.NewJSONHandler(&logs, nil))}
	type res struct {
		s   *gateway.Server
		err error
	}
	done := make(chan res, 1)
	go func() {
		s, err := gateway.NewContext(context.Background(), cfg)
		done <- res{s, err}
	}()
	end := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "database unreachable; retrying") {
		if time.Now().After(end) {
			t.Fatalf("no retry logged:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if l := logs.String(); !strings.Contains(l, "database=later") || !strings.Contains(l, c.Dir()) {
		t.Errorf("the retry does not say what was dialled:\n%s", l)
	}
	if err := c.CreateDatabase(context.Background(), "later"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("start once the database is there: %v", r.err)
		}
		if _, err := r.s.Store().Nodes(); err != nil {
			t.Error(err)
		}
		r.s.Store().Close()
	case <-time.After(60 * time.Second):
		t.Fatal("the gateway did not start within 60s of the database appearing")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	cfg.Database, cfg.Log = c.URL("never"), nil
	start := time.Now()
	if _, err := gateway.NewContext(ctx, cfg); err == nil || !strings.Contains(err.Error(), "database unreachable") {
		t.Errorf("start given up: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("giving up took %s", d)
	}
}

// A database migrated by a newer bcgw is refused at once, saying so (no
// retry loop).
func TestStoreRefusesNewerSchema(t *testing.T) {
	c := pgtest.StartT(t)
	ctx := context.Background()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from-the-future.sql')`, pgstore.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuf
	start := time.Now()
	kekFile, _ := writeKEK(t)
	_, err = gateway.NewContext(ctx, gateway.Config{DataDir: filepath.Join(t.TempDir(), "gw"), Listen: "127.0.0.1:0", Database: url, KEKFile: kekFile,
		Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err == nil || !strings.Contains(err.Error(), "newer") || !strings.Contains(err.Error(), "run a bcgw at least as new") {
		t.Fatalf("start on a newer schema: %v", err)
	}
	if d := time.Since(start); d > 20*time.Second || strings.Contains(logs.String(), "retrying") {
		t.Errorf("refusal took %s; logs:\n%s", d, logs.String())
	}
}
