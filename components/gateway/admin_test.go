package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/admin"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/wellknown"
)

func TestAdminAPI(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	st, err := os.Stat(filepath.Join(g.dir, adminapi.AdminSocket))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("admin socket mode %v, want a socket with 0600", st.Mode())
	}
	ctx := context.Background()
	ac := adminapi.NewClient(g.dir, "", "")

	if _, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "admin", Uses: 1}); err == nil {
		t.Error("token for role admin was created")
	}
	if _, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "node", Uses: 0}); err == nil {
		t.Error("token with 0 uses was created")
	}
	tr, err := ac.CreateToken(ctx, adminapi.TokenRequest{Role: "node", Site: "fsn1", Uses: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tr.Token, "bcjt_"+tr.ID+"_") || tr.ExpiresAt.IsZero() {
		t.Fatalf("token response %+v", tr)
	}
	a, err := join.Join(ctx, joinOpts(g, g.client(t, nil), tr.Token, t.TempDir()))
	if err != nil {
		t.Fatalf("join with the admin-created token: %v", err)
	}
	nodes, err := ac.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].ID != a.NodeID || nodes[0].Site != "fsn1" || nodes[0].Connected || nodes[0].Revoked {
		t.Fatalf("nodes %+v, want the one joined node, site fsn1, not connected", nodes)
	}
	if _, err := ac.Send(ctx, adminapi.CommandRequest{Node: "node_nosuch", Kind: "agent.ping"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("send to an unknown node: %v, want not found", err)
	}
	if _, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping", Body: json.RawMessage(`{"x":1}`), DeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	cv, err := ac.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "agent.ping"})
	if err != nil {
		t.Fatal(err)
	}
	if cv.State != store.StatePending || cv.Node != a.NodeID || cv.Kind != "agent.ping" {
		t.Errorf("sent command view %+v", cv)
	}
	got, err := ac.Command(ctx, cv.ID, 0)
	if err != nil || got.ID != cv.ID || got.State != store.StatePending {
		t.Errorf("command %+v %v", got, err)
	}
	if _, err := ac.Command(ctx, "cmd_nosuch", 0); err == nil {
		t.Error("unknown command read without error")
	}
	if err := ac.Revoke(ctx, "node_nosuch"); err == nil {
		t.Error("revoke of an unknown node succeeded")
	}
	if err := ac.Revoke(ctx, a.NodeID); err != nil {
		t.Fatal(err)
	}
	nodes, _ = ac.Nodes(ctx)
	if len(nodes) != 1 || !nodes[0].Revoked {
		t.Errorf("after revoke: %+v", nodes)
	}
	var doc wellknown.Document
	if err := ac.WellKnown(ctx, &doc); err != nil || doc.Pins != g.pins {
		t.Errorf("admin well-known %+v %v", doc, err)
	}
	if strings.Contains(g.logs.String(), secretOf(tr.Token)) {
		t.Error("the gateway log holds the admin-created token's secret")
	}
}

func TestAdminLoopbackNeedsBearer(t *testing.T) {
	g := startGateway(t, gateway.Config{AdminListen: "127.0.0.1:0"})
	url := g.s.AdminURL()
	if url == "" {
		t.Fatal("no admin URL")
	}
	b, err := os.ReadFile(filepath.Join(g.dir, adminapi.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(g.dir, adminapi.AdminTokenFile)); st.Mode().Perm() != 0o600 {
		t.Errorf("admin token file mode %v, want 0600", st.Mode().Perm())
	}
	bearer := strings.TrimSpace(string(b))
	tests := []struct {
		name   string
		bearer string
		ok     bool
	}{
		{"no bearer", "", false},
		{"wrong bearer", bearer + "x", false},
		{"right bearer", bearer, true},
	}
	for _, tt := range tests {
		_, err := adminapi.NewClient("", url, tt.bearer).Nodes(context.Background())
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
	// The token alone, or under another scheme, is not a bearer token.
	for _, header := range []string{bearer, "bearer " + bearer, "Basic " + bearer, "Bearer  " + bearer, "Bearer " + bearer} {
		req, _ := http.NewRequest(http.MethodGet, url+"/v1/nodes", nil)
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusUnauthorized
		if header == "Bearer "+bearer {
			want = http.StatusOK
		}
		if resp.StatusCode != want {
			t.Errorf("Authorization %q: %d, want %d", strings.Replace(header, bearer, "TOKEN", 1), resp.StatusCode, want)
		}
	}
}

// TestAdminSocketPrivateUnderAnyUmask: under umask 000, with a data
// directory that exists open to all, bcgw tightens the directory to 0700
// and its admin socket is never seen with a mode wider than 0600: not at
// its path (watched from before bcgw starts), and not where it is bound.
func TestAdminSocketPrivateUnderAnyUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, adminapi.AdminSocket)
	var mu sync.Mutex
	var seen []string
	note := func(where string, mode os.FileMode) {
		if mode.Perm()&^0o600 != 0 {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s: %v", where, mode))
			mu.Unlock()
		}
	}
	// Watch the socket's path as fast as the machine lets us until bcgw
	// serves; every mode seen must be 0600 or narrower.
	stop := make(chan struct{})
	watched := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				watched <- n
				return
			default:
			}
			if st, err := os.Lstat(sock); err == nil {
				note("at its path", st.Mode())
				n++
			}
		}
	}()
	cfg := gateway.WithBoundAside(gateway.Config{DataDir: dir}, func(first string) {
		st, err := os.Lstat(first)
		if err != nil {
			t.Errorf("bound socket: %v", err)
			return
		}
		if pst, err := os.Stat(filepath.Dir(first)); err != nil || pst.Mode().Perm() != 0o700 {
			t.Errorf("the socket is bound in %s, not a 0700 directory (%v)", filepath.Dir(first), err)
		}
		if _, err := os.Lstat(sock); err == nil {
			t.Errorf("%s exists before its socket has its mode", sock)
		}
		_ = st // bound under umask 000: wide, but in a 0700 directory no one else can enter
	})
	g := startGateway(t, cfg)
	close(stop)
	if n := <-watched; n == 0 {
		t.Log("the watcher never saw the socket before bcgw served (it checks again below)")
	}
	st, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	note("once serving", st.Mode())
	if st.Mode()&os.ModeSocket == 0 {
		t.Errorf("%s is %v, not a socket", sock, st.Mode())
	}
	if dst, _ := os.Stat(dir); dst.Mode().Perm() != 0o700 {
		t.Errorf("data directory mode %v, want 0700", dst.Mode().Perm())
	}
	if _, err := adminapi.NewClient(g.dir, "", "").Nodes(context.Background()); err != nil {
		t.Errorf("the renamed socket does not serve: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range seen {
		t.Errorf("admin socket wider than 0600 %s", s)
	}
	if ents, _ := os.ReadDir(dir); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".bind-") {
				t.Errorf("the bind directory %s is left behind", e.Name())
			}
		}
	}
}

// TestAdminSocketRemovedOnClose: the socket file goes with its listener.
func TestAdminSocketRemovedOnClose(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "admin.sock")
	l, err := admin.ListenPrivate(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(sock); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", st, err)
	}
	l.Close()
	if _, err := os.Lstat(sock); err == nil {
		t.Error("the socket file outlives its listener")
	}
}

func TestRunRefusesNonLoopbackAdmin(t *testing.T) {
	s, err := gateway.New(gateway.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", AdminListen: "0.0.0.0:0"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("Run with --admin-listen 0.0.0.0: %v, want a loopback error", err)
	}
}
