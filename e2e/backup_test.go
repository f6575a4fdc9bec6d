package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// sh runs one step of docs/gateway-store.md's "Backup and restore" as a
// shell command, with env, and fails the test when it fails.
func (l *lab) sh(script string, env ...string) {
	l.t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Env = append(append(os.Environ(), "PATH="+l.bin+":"+os.Getenv("PATH")), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// joinTokenIDs lists the ids bcgw token ls --json shows.
func (l *lab) joinTokenIDs(g *gw) []string {
	l.t.Helper()
	var ts []struct{ ID string }
	if err := json.Unmarshal([]byte(l.bcgw(g, "token", "ls", "--json")), &ts); err != nil {
		l.t.Fatal(err)
	}
	var ids []string
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return ids
}

// restoredAndBack checks the restored gateway: the node comes back
// without joining again and runs a command, and the token made after
// the backup is gone while the one made before stays.
func (l *lab) restoredAndBack(g *gw, id string, before []string) {
	l.t.Helper()
	l.waitNode(g, id, "connected to the restored gateway", func(n nodeView) bool { return n.Connected })
	l.pingAll(g, []string{id}, "after the restore")
	if got := l.joinTokenIDs(g); strings.Join(got, " ") != strings.Join(before, " ") {
		l.t.Errorf("join tokens after the restore: %v, want those of the backup %v", got, before)
	}
	if strings.Contains(g.stderr.String(), `"msg":"node joined"`) {
		l.t.Error("a node joined again")
	}
}

// TestBackupRestoreBolt: the bbolt procedure of docs/gateway-store.md,
// with the data directory lost between the backup and the restore.
func TestBackupRestoreBolt(t *testing.T) {
	l := newLab(t)
	data, backup := filepath.Join(l.root, "gw"), filepath.Join(l.root, "backup")
	if err := os.Mkdir(backup, 0o700); err != nil {
		t.Fatal(err)
	}
	g := l.startGateway(data, "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	l.token(g, "--uses", "3")
	before := l.joinTokenIDs(g)
	env := []string{"DATA=" + data, "BACKUP=" + backup}
	l.sh(`bcgw backup --data-dir "$DATA" --out "$BACKUP/bcgw.db"
tar -C "$DATA" -cf "$BACKUP/bcgw-files.tar" --exclude ./bcgw.db --exclude ./admin.sock --exclude ./admin.token .`, env...)
	l.token(g, "--uses", "5") // after the backup: gone after the restore
	if st, err := os.Stat(filepath.Join(backup, "bcgw.db")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the backup: %v %v", st, err)
	}

	addr := g.addr
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	l.sh(`mkdir -p -m 0700 "$DATA" && tar -C "$DATA" -xpf "$BACKUP/bcgw-files.tar"
install -m 0600 "$BACKUP/bcgw.db" "$DATA/bcgw.db"`, env...)
	g = l.startGateway(data, addr)
	l.restoredAndBack(g, id, before)
}

// TestBackupRestorePostgres: the PostgreSQL procedure of
// docs/gateway-store.md, restored into a new database.
func TestBackupRestorePostgres(t *testing.T) {
	c := pgtest.StartT(t)
	bin, err := pgtest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	newURL, err := c.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t)
	backup := filepath.Join(l.root, "backup")
	if err := os.Mkdir(backup, 0o700); err != nil {
		t.Fatal(err)
	}
	dbFile, newDBFile := filepath.Join(l.root, "database.url"), filepath.Join(l.root, "new-database.url")
	for f, u := range map[string]string{dbFile: url, newDBFile: newURL} {
		if err := os.WriteFile(f, []byte(u+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kek := l.kekFile()
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--database-file", dbFile, "--key-encryption-key", kek)
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	before := l.joinTokenIDs(g)
	env := []string{"BACKUP=" + backup, "URL=" + url, "NEW_URL=" + newURL, "PATH=" + bin + ":" + l.bin + ":" + os.Getenv("PATH")}
	l.sh(`pg_dump --format=custom --file="$BACKUP/bcgw.pgdump" --dbname="$URL"`, env...)
	l.token(g, "--uses", "5")

	addr := g.addr
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	l.sh(`pg_restore --no-owner --exit-on-error --dbname="$NEW_URL" "$BACKUP/bcgw.pgdump"`, env...)
	g = l.startGateway(filepath.Join(l.root, "gw-new"), addr, "--database-file", newDBFile, "--key-encryption-key", kek)
	l.restoredAndBack(g, id, before)
}
