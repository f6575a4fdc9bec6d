package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// TestGatewayOnPostgres: bcgw serve --database-file keeps its store in a
// real PostgreSQL (a cluster this test makes): a fakehw node joins, a
// command runs, bcgw restarts, and the node, the command's result and its
// events are still there, the result stored once; the data directory
// holds no bbolt file. A URL with a password on argv is refused without
// showing it.
func TestGatewayOnPostgres(t *testing.T) {
	c := pgtest.StartT(t)
	ctx := context.Background()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t)

	const pw = "pg-s3cret-on-argv"
	code, _, errOut := l.run("", nil, "bcgw", "serve", "--data-dir", filepath.Join(l.root, "refused"), "--listen", "127.0.0.1:0",
		"--database", "postgres://bcgw:"+pw+"@127.0.0.1:1/x")
	if code == 0 || !strings.Contains(errOut, "--database-file") || strings.Contains(errOut, pw) {
		t.Fatalf("bcgw serve with a password on argv: exit %d, %q", code, errOut)
	}

	dbFile := filepath.Join(l.root, "database.url")
	if err := os.WriteFile(dbFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gwDir := filepath.Join(l.root, "gw")
	// Without its key-encryption key a gateway on a database does not
	// start (no fallback to key files), and says which flag it lacks.
	code, _, errOut = l.run("", nil, "bcgw", "serve", "--data-dir", gwDir, "--listen", "127.0.0.1:0", "--database-file", dbFile)
	if code == 0 || !strings.Contains(errOut, "--key-encryption-key FILE") {
		t.Fatalf("bcgw serve on a database without a KEK: exit %d, %q", code, errOut)
	}
	if f := keyFilesOf(t, gwDir); len(f) > 0 {
		t.Fatalf("a refused start wrote key files: %v", f)
	}
	kek := l.kekFile()
	g := l.startGateway(gwDir, "127.0.0.1:0", "--database-file", dbFile, "--key-encryption-key", kek)
	g.waitLog(t, "store on PostgreSQL", time.Second)
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	var cmd struct{ ID, State, Status string }
	if err := json.Unmarshal([]byte(l.bcgw(g, "run", id, "fakehw.mark", "--wait")), &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.State != "done" || cmd.Status != "SUCCEEDED" {
		t.Fatalf("fakehw.mark: %+v", cmd)
	}
	if _, err := os.Stat(filepath.Join(gwDir, "bcgw.db")); !os.IsNotExist(err) {
		t.Errorf("bcgw on PostgreSQL made a bbolt file: %v", err)
	}
	if f := keyFilesOf(t, gwDir); len(f) > 0 {
		t.Errorf("bcgw on PostgreSQL wrote key files: %v", f)
	}

	// Restart bcgw on the same database and address.
	g.signal(syscall.SIGTERM)
	if code := g.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("bcgw after SIGTERM: exit %d", code)
	}
	g = l.startGateway(gwDir, g.addr, "--database-file", dbFile, "--key-encryption-key", kek)
	l.waitNode(g, id, "reconnected after the restart", func(n nodeView) bool { return n.Connected && n.Epoch >= 2 })
	var after struct{ ID, State, Status string }
	if err := json.Unmarshal([]byte(l.bcgw(g, "cancel", cmd.ID)), &after); err != nil { // a done command: cancel only shows it
		t.Fatal(err)
	}
	if after.State != "done" || after.Status != "SUCCEEDED" {
		t.Fatalf("the command after the restart: %+v", after)
	}
	if code, out, errOut := l.run("", nil, "bcgw", "run", id, "agent.ping", "--wait", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("ping after the restart: %s %s", out, errOut)
	}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows int
	var rec []byte
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM commands WHERE id = $1 AND state = 'done'`, cmd.ID).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT record FROM commands WHERE id = $1`, cmd.ID).Scan(&rec); err != nil {
		t.Fatal(err)
	}
	var stored struct {
		ResultCopies int `json:"result_copies"`
	}
	_ = json.Unmarshal(rec, &stored)
	if rows != 1 || stored.ResultCopies < 1 {
		t.Errorf("the command in PostgreSQL: %d rows, %d result copies", rows, stored.ResultCopies)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log")); strings.Count(string(b), cmd.ID) != 1 {
		t.Errorf("the mark ran %d times:\n%s", strings.Count(string(b), cmd.ID), b)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	l.out.assertAbsent(t, "the database password", pw)
}
