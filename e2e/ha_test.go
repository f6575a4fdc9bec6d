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

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// haLab is several bcgw on one PostgreSQL database behind HAProxy.
type haLab struct {
	*lab
	url    string // the database
	dbFile string
	ha     string // HAProxy's address, the one agents dial
	gws    []*gw
	ports  []string
	health []string // each gateway's plain-HTTP health check (--health)
	// haproxy is the balancer's process (its log says which gateways
	// its health check marks down).
	haproxy *proc
}

// kekFile makes the fleet's key-encryption key once, with bcgw kek
// generate (a new 0600 file in the lab), and returns its path. The
// gateways on a database store their keys there sealed under it; no
// output of any process of the lab may show it.
func (l *lab) kekFile() string {
	l.t.Helper()
	p := filepath.Join(l.root, "bcgw.kek")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if code, _, errOut := l.run("", nil, "bcgw", "kek", "generate", "--out", p); code != 0 {
		l.t.Fatalf("bcgw kek generate: exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		l.t.Fatal(err)
	}
	key := strings.TrimSpace(strings.TrimPrefix(string(b), "bcgw-kek-v1:"))
	if len(key) != 43 {
		l.t.Fatalf("bcgw kek generate wrote %d bytes", len(b))
	}
	l.t.Cleanup(func() { l.out.assertAbsent(l.t, "the key-encryption key", key) })
	return p
}

// keyFilesOf lists the key files (CAs, keys, JWKs) in a data directory.
func keyFilesOf(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".key") || strings.HasSuffix(n, ".crt") || strings.HasSuffix(n, ".jwk") {
			out = append(out, n)
		}
	}
	return out
}

// newHALab starts a PostgreSQL cluster, n gateways on one database of it
// and HAProxy in front. The gateways share one key-encryption key and no
// key file: the first stores the keys in the database, sealed, and the
// others read them there, so all serve under the same pins.
func newHALab(t *testing.T, n int, extra ...string) *haLab {
	t.Helper()
	c := pgtest.StartT(t)
	url, err := c.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return newHALabOn(t, url, n, 4096, extra...)
}

// haproxyMaxconn is the most connections one HAProxy process is given.
const haproxyMaxconn = 9000

// newHALabOn is newHALab on the database at url, with HAProxy's maxconn
// (the agents it must hold at once).
func newHALabOn(t testing.TB, url string, n, maxconn int, extra ...string) *haLab {
	t.Helper()
	h := &haLab{lab: newLab(t), url: url, ha: freePort(t)}
	h.dbFile = filepath.Join(h.root, "database.url")
	if err := os.WriteFile(h.dbFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h.ports = append(h.ports, freePort(t))
		h.health = append(h.health, freePort(t))
		h.gws = append(h.gws, nil)
		h.startGW(i, extra...)
	}
	pins := h.bcgw(h.gws[0], "well-known", "--pins")
	for _, g := range h.gws {
		if f := keyFilesOf(t, g.dataDir); len(f) > 0 {
			t.Fatalf("key files in %s: %v", g.dataDir, f)
		}
		if p := h.bcgw(g, "well-known", "--pins"); p != pins {
			t.Fatalf("the gateways' pins differ:\n%s\n%s", pins, p)
		}
	}
	// One HAProxy process holds at most about haproxyMaxconn connections
	// here: each takes two descriptors, and RLIMIT_NOFILE is 20,000 and
	// cannot be raised. More start several processes on the same address
	// (SO_REUSEPORT, HAProxy's default on Linux), among which the kernel
	// spreads the agents; the first is h.haproxy.
	procs := (maxconn + haproxyMaxconn - 1) / haproxyMaxconn
	per := (maxconn + procs - 1) / procs
	h.haproxy = h.startHAProxy(per, h.ha, h.ports, h.health)
	for range procs - 1 {
		h.startHAProxy(per, h.ha, h.ports, h.health)
	}
	return h
}

// gwName is gateway i's name (bcgw serve --name) and data dir.
func (h *haLab) gwName(i int) string { return "gw" + string(rune('1'+i)) }

// startGW starts (or starts again) gateway i on its port and data dir.
func (h *haLab) startGW(i int, extra ...string) *gw {
	h.t.Helper()
	dir := filepath.Join(h.root, h.gwName(i))
	g := h.startGateway(dir, h.ports[i], append([]string{"--name", h.gwName(i), "--database-file", h.dbFile, "--key-encryption-key", h.kekFile(), "--url", "https://" + h.ha, "--health", h.health[i]}, extra...)...)
	g.waitLog(h.t, "listening for the other gateways' notices", 30*time.Second)
	h.gws[i] = g
	return g
}

// waitHolder waits (60 s) for node's first session through HAProxy and
// returns the gateway holding it.
func (h *haLab) waitHolder(node string) int {
	h.t.Helper()
	all := func(int) bool { return true }
	end := time.Now().Add(60 * time.Second)
	for {
		if i := h.holder(node, 1, all); i >= 0 {
			return i
		}
		if time.Now().After(end) {
			h.t.Fatal("the node did not connect through HAProxy within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// front is gateway i as agents see it: its data dir (pins, admin) and
// HAProxy's address.
func (h *haLab) front(i int) *gw {
	return &gw{proc: h.gws[i].proc, dataDir: h.gws[i].dataDir, addr: h.ha}
}

// holder returns the index of the live gateway holding node's session
// with at least epoch minEpoch, or -1.
func (h *haLab) holder(node string, minEpoch uint64, alive func(int) bool) int {
	for i, g := range h.gws {
		if !alive(i) {
			continue
		}
		code, out, _ := h.run("", nil, "bcgw", "nodes", "--json", "--data-dir", g.dataDir)
		if code != 0 {
			continue
		}
		var ns []nodeView
		if json.Unmarshal([]byte(out), &ns) != nil {
			continue
		}
		for _, n := range ns {
			if n.ID == node && n.Connected && n.Gateway == h.gwName(i) && n.Epoch >= minEpoch {
				return i
			}
		}
	}
	return -1
}

// TestGatewayFailoverBehindHAProxy: two bcgw on one PostgreSQL behind
// HAProxy (TCP, TLS passed through); a fakehw node joins and connects
// through HAProxy. A slow command is sent through the gateway that does
// not hold the session; while it runs, the holder is killed with SIGKILL.
// The node reconnects through HAProxy to the other gateway, which replays
// what was in flight; the result reaches the store exactly once and the
// side effect happened once. A command sent through the restarted gateway
// reaches the node on the other.
func TestGatewayFailoverBehindHAProxy(t *testing.T) {
	h := newHALab(t, 2)
	cfg, id := h.joinNode(h.front(0), "n", h.token(h.gws[0], "--uses", "1"), "node")
	node := h.start("bcd-node", "node", "--config", cfg)
	hold := h.waitHolder(id)
	other := 1 - hold
	t.Logf("session on gw%d; commands through gw%d", hold+1, other+1)

	// A quick command first, through the gateway without the session.
	admin := adminapi.NewClient(h.gws[other].dataDir, "", "")
	ctx := context.Background()
	c0, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "agent.ping"})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := admin.Command(ctx, c0.ID, 20*time.Second); err != nil || v.Status != "SUCCEEDED" {
		t.Fatalf("ping through the other gateway: %+v %v", v, err)
	}
	// The gateway without the session says which one holds it, and sends
	// a tunnel there.
	code, out, _ := h.run("", nil, "bcgw", "nodes", "--data-dir", h.gws[other].dataDir)
	if code != 0 || !strings.Contains(out, h.gwName(hold)) {
		t.Errorf("bcgw nodes on gw%d: exit %d\n%s\nwant the session on %s", other+1, code, out, h.gwName(hold))
	}
	code, _, errOut := h.run("", nil, "bcgw", "tunnel", id, "--tcp", "22", "--data-dir", h.gws[other].dataDir)
	if want := "is on gateway " + h.gwName(hold); code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("bcgw tunnel on gw%d: exit %d, %s\nwant exit 1 and %q", other+1, code, errOut, want)
	}

	// The slow one: 6 s, the mark in its middle.
	c1, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "fakehw.mark", Body: json.RawMessage(`{"sleep_ms":6000}`)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	end := time.Now().Add(20 * time.Second)
	for {
		var state string
		if err := conn.QueryRow(ctx, `SELECT state FROM commands WHERE id = $1`, c1.ID).Scan(&state); err != nil {
			t.Fatal(err)
		}
		if state == "delivered" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the slow command is %s after 20s", state)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // running now, mid-command
	killed := time.Now()
	h.gws[hold].signal(syscall.SIGKILL)
	h.gws[hold].wait(t, 10*time.Second)
	alive := func(i int) bool { return i != hold }
	end = time.Now().Add(60 * time.Second)
	for h.holder(id, 2, alive) != other {
		if time.Now().After(end) {
			t.Fatal("the node did not reconnect to the other gateway within 60s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("reconnected to gw%d %s after the kill", other+1, time.Since(killed).Round(10*time.Millisecond))

	v, err := admin.Command(ctx, c1.ID, 30*time.Second)
	if err != nil || v.State != "done" || v.Status != "SUCCEEDED" {
		t.Fatalf("the slow command after the kill: %+v %v", v, err)
	}
	var rows, copies int
	var rec []byte
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM commands WHERE id = $1 AND state = 'done'`, c1.ID).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT record FROM commands WHERE id = $1`, c1.ID).Scan(&rec); err != nil {
		t.Fatal(err)
	}
	var stored struct {
		ResultCopies int `json:"result_copies"`
		Result       *struct {
			Status string `json:"status"`
		} `json:"result"`
	}
	if err := json.Unmarshal(rec, &stored); err != nil {
		t.Fatal(err)
	}
	copies = stored.ResultCopies
	if rows != 1 || copies < 1 || stored.Result == nil || stored.Result.Status != "SUCCEEDED" {
		t.Errorf("the command in PostgreSQL: %d done rows, %d result copies, %+v", rows, copies, stored.Result)
	}
	marks, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log"))
	if n := strings.Count(string(marks), c1.ID); n != 1 {
		t.Errorf("the mark of %s happened %d times:\n%s", c1.ID, n, marks)
	}

	// The killed gateway comes back; a command through it reaches the
	// node on the other.
	g := h.startGW(hold)
	back := adminapi.NewClient(g.dataDir, "", "")
	c2, err := back.Send(ctx, adminapi.CommandRequest{Node: id, Kind: "fakehw.mark"})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := back.Command(ctx, c2.ID, 30*time.Second); err != nil || v.Status != "SUCCEEDED" {
		t.Fatalf("a command through the restarted gateway: %+v %v", v, err)
	}
	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
}
