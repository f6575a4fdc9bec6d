package gateway_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/keys"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// keyLab is one PostgreSQL cluster for the key tests; each test takes a
// fresh database of it.
type keyLab struct {
	t *testing.T
	c *pgtest.Cluster
	// seen collects every log and error of the gateways started, for the
	// check that no secret reached them.
	mu   sync.Mutex
	seen []string
}

func newKeyLab(t *testing.T) *keyLab {
	t.Helper()
	c := pgtest.StartT(t)
	return &keyLab{t: t, c: c}
}

func (l *keyLab) db() string {
	l.t.Helper()
	url, err := l.c.NewDatabase(context.Background())
	if err != nil {
		l.t.Fatal(err)
	}
	return url
}

// start makes a gateway (New only, not Run) on url with the KEK file
// kekFile and the data dir dir; it returns the server (nil on error),
// its error and its logs.
func (l *keyLab) start(url, kekFile, dir string) (*gateway.Server, error, string) {
	return l.startWith(url, kekFile, dir, nil)
}

// startWith is start with a hook run where the gateway found no key set
// in the database, before it offers its own.
func (l *keyLab) startWith(url, kekFile, dir string, beforeKeySet func()) (*gateway.Server, error, string) {
	var logs lockedBuf
	cfg := gateway.Config{DataDir: dir, Listen: "127.0.0.1:0", URL: "https://bcgw.test:8443", Database: url, KEKFile: kekFile,
		Log: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	s, err := gateway.New(gateway.WithBeforeKeySet(cfg, beforeKeySet))
	l.mu.Lock()
	l.seen = append(l.seen, logs.String())
	if err != nil {
		l.seen = append(l.seen, err.Error())
	}
	l.mu.Unlock()
	if s != nil {
		l.t.Cleanup(func() { s.Store().Close() })
	}
	return s, err, logs.String()
}

// mustStart is start that fails the test on an error.
func (l *keyLab) mustStart(url, kekFile, dir string) (*gateway.Server, string) {
	l.t.Helper()
	s, err, logs := l.start(url, kekFile, dir)
	if err != nil {
		l.t.Fatalf("start on %s: %v\n%s", dir, err, logs)
	}
	return s, logs
}

// secretsOf are the strings no log or error may hold: each key's PEM
// body lines and DER in base64 (PEM's own), and the KEK files' keys.
func secretsOf(t *testing.T, keys map[string][]byte, kekFiles ...[]byte) []string {
	t.Helper()
	var out []string
	for name, b := range keys {
		if strings.HasSuffix(name, ".crt") {
			continue // certificates are public
		}
		if blk, _ := pem.Decode(b); blk != nil {
			for _, line := range strings.Split(string(b), "\n") {
				if len(line) >= 40 && !strings.HasPrefix(line, "-----") {
					out = append(out, line)
				}
			}
			continue
		}
		out = append(out, string(b)) // the JWK, whole
		if i := bytes.Index(b, []byte(`"d":"`)); i >= 0 {
			out = append(out, string(b[i+5:i+5+20]))
		}
	}
	for _, f := range kekFiles {
		k := strings.TrimSpace(string(f))
		out = append(out, k, k[len(k)-43:len(k)-43+20])
	}
	return out
}

// checkNoSecrets fails when any log or error seen holds a secret.
func (l *keyLab) checkNoSecrets(secrets []string) {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range secrets {
		for _, text := range l.seen {
			if strings.Contains(text, s) {
				l.t.Errorf("a log or error holds a secret (%.12s...):\n%s", s, text)
			}
		}
	}
}

func (l *keyLab) exec(url, sql string, args ...any) {
	l.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		l.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		l.t.Fatal(err)
	}
}

// rawKeyTables is every byte the key tables hold, as PostgreSQL prints
// each row (bytea as hex) and as the raw bytea values.
func (l *keyLab) rawKeyTables(url string) []byte {
	l.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		l.t.Fatal(err)
	}
	defer conn.Close(ctx)
	var out []byte
	for _, q := range []string{`SELECT t::text::bytea FROM gateway_keys t`, `SELECT sealed FROM gateway_keys`,
		`SELECT t::text::bytea FROM gateway_kek t`, `SELECT convert_to(t::text, 'UTF8') FROM meta t`} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			l.t.Fatal(err)
		}
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				l.t.Fatal(err)
			}
			out = append(out, b...)
			out = append(out, '\n')
		}
		rows.Close()
	}
	return out
}

// Gateways starting at the same moment on an empty database, with empty
// data directories and one KEK, end up with one key set: the same serving
// CA, signing keys and every other key. (They meet after each found the
// database empty, so each offers a set of its own.) The database holds none
// of them in the clear, the data directories hold no key file, and a
// third gateway started later reads the same set.
func TestKeysInDatabaseOneSetAtFirstStart(t *testing.T) {
	l := newKeyLab(t)
	url := l.db()
	kekFile, kekBytes := writeKEK(t)
	root := t.TempDir()
	var wg, met sync.WaitGroup
	servers := make([]*gateway.Server, 3)
	errs := make([]error, len(servers))
	met.Add(len(servers))
	for i := range servers {
		wg.Go(func() {
			s, err, _ := l.startWith(url, kekFile, filepath.Join(root, "gw"+string(rune('1'+i))), func() { met.Done(); met.Wait() })
			servers[i], errs[i] = s, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("gateway %d: %v", i+1, err)
		}
	}
	later, logs := l.mustStart(url, kekFile, filepath.Join(root, "gw4"))
	if !strings.Contains(logs, "keys read from the database") {
		t.Errorf("the later gateway's log:\n%s", logs)
	}
	k1 := servers[0].KeyFiles()
	if len(k1) != len(keys.SharedFiles) {
		t.Fatalf("the key set has %d keys, want %d", len(k1), len(keys.SharedFiles))
	}
	pins := func(s *gateway.Server) string {
		d, err := s.WellKnown()
		if err != nil {
			t.Fatal(err)
		}
		return d.Pins.ServingCA + " " + d.Pins.JoinSigning + " " + d.Pins.JoinEncryption + " " + string(s.OwnCommandKey())
	}
	for i, s := range append(servers[1:], later) {
		for name, b := range s.KeyFiles() {
			if !bytes.Equal(b, k1[name]) {
				t.Errorf("gateway %d holds another %s than gateway 1", i+2, name)
				break
			}
		}
		if pins(s) != pins(servers[0]) {
			t.Errorf("gateway %d pins %s, gateway 1 %s", i+2, pins(s), pins(servers[0]))
		}
	}
	for i := range 4 {
		if f := keyFilesIn(t, filepath.Join(root, "gw"+string(rune('1'+i)))); len(f) > 0 {
			t.Errorf("gateway %d wrote key files: %v", i+1, f)
		}
	}

	// No key's bytes in the database: not its PEM, not its DER, not the
	// JWK's private part, nor the KEK.
	raw := l.rawKeyTables(url)
	if len(raw) < 500 {
		t.Fatalf("read only %d bytes of the key tables", len(raw))
	}
	for name, b := range k1 {
		if strings.HasSuffix(name, ".crt") {
			continue
		}
		needles := [][]byte{b}
		if blk, _ := pem.Decode(b); blk != nil {
			needles = append(needles, blk.Bytes, blk.Bytes[len(blk.Bytes)-32:], []byte(strings.Split(string(b), "\n")[1]))
		} else if i := bytes.Index(b, []byte(`"d":"`)); i >= 0 {
			needles = append(needles, b[i:i+25])
		}
		for _, n := range needles {
			if bytes.Contains(raw, n) || bytes.Contains(raw, []byte(hexOf(n))) {
				t.Errorf("the key tables hold %s in the clear (%d bytes of it)", name, len(n))
			}
		}
	}
	l.checkNoSecrets(secretsOf(t, k1, kekBytes))
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// A gateway given another KEK than the one the database's keys are sealed
// under is refused, the error naming both fingerprints and the fix; so is
// a gateway on a database without a KEK, naming the flag; so is a
// malformed or world-readable KEK file. Nothing is stored by a refused
// start, and no error or log holds a secret.
func TestKeysRefusedWithoutTheKEK(t *testing.T) {
	l := newKeyLab(t)
	url := l.db()
	kekFile, kekBytes := writeKEK(t)
	otherFile, otherBytes := writeKEK(t)
	s, _ := l.mustStart(url, kekFile, t.TempDir())
	k1, _ := kek.Parse(kekBytes)
	k2, _ := kek.Parse(otherBytes)

	_, err, _ := l.start(url, otherFile, t.TempDir())
	want := "the database's keys are sealed under key-encryption key " + k1.Fingerprint() + "; this gateway was given " + k2.Fingerprint() + ": give it the same file as the other gateways"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("another KEK: %v\nwant %q", err, want)
	}

	_, err, _ = l.start(url, "", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "--key-encryption-key FILE") || !strings.Contains(err.Error(), "bcgw kek generate") {
		t.Errorf("no KEK: %v", err)
	}
	if _, err := os.Stat(filepath.Join(t.TempDir(), "serving-ca.key")); err == nil {
		t.Error("a start without a KEK fell back to key files")
	}

	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err, _ = l.start(url, bad, t.TempDir()); err == nil || !strings.Contains(err.Error(), "--key-encryption-key") || !strings.Contains(err.Error(), "bcgw kek generate") {
		t.Errorf("malformed KEK file: %v", err)
	}
	open := filepath.Join(t.TempDir(), "open")
	if err := os.WriteFile(open, kekBytes, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err, _ = l.start(url, open, t.TempDir()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable KEK file: %v", err)
	}
	l.checkNoSecrets(secretsOf(t, s.KeyFiles(), kekBytes, otherBytes))
}

// A sealed key changed in the database (one byte flipped, or a key's blob
// swapped for another's) is refused at start, the error naming that key.
func TestKeysTamperedRefused(t *testing.T) {
	l := newKeyLab(t)
	url := l.db()
	kekFile, kekBytes := writeKEK(t)
	s, _ := l.mustStart(url, kekFile, t.TempDir())
	for _, tc := range []struct{ name, key, sql string }{
		{"a byte flipped", "node-ca.key",
			`UPDATE gateway_keys SET sealed = overlay(sealed placing decode(lpad(to_hex(get_byte(sealed, 20) # 1), 2, '0'), 'hex') from 21 for 1) WHERE name = 'node-ca.key'`},
		{"another key's blob", "join-signing.key",
			`UPDATE gateway_keys SET sealed = (SELECT sealed FROM gateway_keys WHERE name = 'workload-signing.key') WHERE name = 'join-signing.key'`},
		{"the version changed", "ticket-signing.key",
			`UPDATE gateway_keys SET version = 2 WHERE name = 'ticket-signing.key'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := l.db()
			first, _ := l.mustStart(db, kekFile, t.TempDir())
			first.Store().Close()
			l.mustStart(db, kekFile, t.TempDir()) // untampered, the set opens
			l.exec(db, tc.sql)
			_, err, _ := l.start(db, kekFile, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), "the database's key "+tc.key) || !errors.Is(err, kek.ErrNotOpened) {
				t.Fatalf("start on a tampered key: %v", err)
			}
		})
	}
	l.checkNoSecrets(secretsOf(t, s.KeyFiles(), kekBytes))
}

// A gateway whose data directory holds key files (a bbolt gateway moving
// to PostgreSQL, or today's fleet with copied keys) and whose database
// has none imports them once: its pins stay the same, the log says so
// and names the files it no longer uses, which stay where they are. A
// second gateway with an empty data directory takes the same keys; the
// first, restarted, is told its files may be removed. A gateway whose
// key files differ from the database's is refused, naming the file.
func TestKeysAdoptedFromDataDir(t *testing.T) {
	l := newKeyLab(t)
	// A gateway on bbolt, its keys files in d1 (the SSH user CA made on
	// first use, as ssh-ca does; the ticket-signing key not used yet).
	d1 := filepath.Join(t.TempDir(), "gw1")
	g := startGateway(t, gateway.Config{DataDir: d1})
	if _, err := g.s.SSHCA(adminapi.SSHCARequest{}); err != nil {
		t.Fatal(err)
	}
	before := g.s.KeyFiles()
	bdoc, err := g.s.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.stop(true); err != nil {
		t.Fatal(err)
	}
	files := keyFilesIn(t, d1)
	if len(files) != len(keys.SharedFiles)-1 || slices.Contains(files, "ticket-signing.key") {
		t.Fatalf("the bbolt gateway's key files: %v", files)
	}

	url := l.db()
	kekFile, kekBytes := writeKEK(t)
	s1, logs := l.mustStart(url, kekFile, d1)
	if !strings.Contains(logs, "adopted the data directory's key files into the database") || !strings.Contains(logs, `"removable":["command-signing.key"`) ||
		!strings.Contains(logs, `"made":["ticket-signing.key"]`) {
		t.Errorf("the adoption's log:\n%s", logs)
	}
	adoc, err := s1.WellKnown()
	if err != nil {
		t.Fatal(err)
	}
	if adoc.Pins != bdoc.Pins {
		t.Errorf("pins after adoption %+v, before %+v", adoc.Pins, bdoc.Pins)
	}
	for name, b := range s1.KeyFiles() {
		if before[name] != nil && !bytes.Equal(b, before[name]) {
			t.Errorf("%s changed by the adoption", name)
		}
	}
	if got := keyFilesIn(t, d1); !slices.Equal(got, files) {
		t.Errorf("the key files after adoption: %v, want them left: %v", got, files)
	}

	s2, _ := l.mustStart(url, kekFile, filepath.Join(t.TempDir(), "gw2"))
	if doc, _ := s2.WellKnown(); doc.Pins != bdoc.Pins {
		t.Errorf("the second gateway's pins %+v, want %+v", doc.Pins, bdoc.Pins)
	}
	s1.Store().Close()
	_, logs = l.mustStart(url, kekFile, d1)
	if !strings.Contains(logs, "no longer used, and may be removed") || !strings.Contains(logs, "serving-ca.key") {
		t.Errorf("the restart's log:\n%s", logs)
	}

	// Another gateway's key files on this database: refused, not picked.
	d3 := filepath.Join(t.TempDir(), "gw3")
	g3 := startGateway(t, gateway.Config{DataDir: d3})
	other := g3.s.KeyFiles()
	if err := g3.stop(true); err != nil {
		t.Fatal(err)
	}
	_, err, _ = l.start(url, kekFile, d3)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(d3, "")) || !strings.Contains(err.Error(), "differs from the key") ||
		!strings.Contains(err.Error(), "move the data directory's key files") {
		t.Errorf("differing key files: %v", err)
	}
	if doc, _ := s2.WellKnown(); doc.Pins != bdoc.Pins {
		t.Error("the refused start changed the fleet's keys")
	}
	l.checkNoSecrets(secretsOf(t, before, kekBytes))
	l.checkNoSecrets(secretsOf(t, other))
}
