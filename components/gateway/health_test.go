package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// A database lost while serving is shown: the gateway logs it once, `bcgw
// health` (the admin API) says unreachable with the error naming the
// database, and the agents' port answers 503 on /readyz, as does the
// plain-HTTP health port a balancer's health check reads, so it sends
// agents elsewhere; all three turn back when the database answers again.
// Once the database stayed unreachable for the drain delay, the gateway's
// sessions get a Drain (the balancer no longer ends them). With bbolt
// /readyz is always 200.
func TestDatabaseLostIsShown(t *testing.T) {
	defer fleet.SetHealthEvery(50 * time.Millisecond)()
	defer fleet.SetDrainLostAfter(500 * time.Millisecond)()
	proxy, dbURL := pgtest.NewProxy(t, pgtest.Database(t))
	kekFile, _ := writeKEK(t)
	g := startGateway(t, gateway.Config{Database: dbURL, KEKFile: kekFile, HealthListen: "127.0.0.1:0"})
	_, hc := g.clientHC(t, nil)
	get := func(c *http.Client, url string) (int, string) {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	plainURL := "http://" + g.s.HealthAddr().String() + adminapi.ReadyPath
	// ready is /readyz on the agents' port; the health port must say the same.
	// The health check runs every 50 ms, so the state may change between
	// the two reads: the health port is compared with the agents' port
	// read before and after it, when both of those agree.
	ready := func() (int, string) {
		for try := 0; ; try++ {
			if try == 50 {
				t.Fatal("the agents' port's /readyz changed between every two reads 50 times in a row")
			}
			code, body := get(hc, g.url+adminapi.ReadyPath)
			pc, pb := get(http.DefaultClient, plainURL)
			if c2, b2 := get(hc, g.url+adminapi.ReadyPath); c2 != code || b2 != body {
				continue
			}
			if pc != code || pb != body {
				t.Errorf("the health port answers %d %q, the agents' port %d %q", pc, pb, code, body)
			}
			return code, body
		}
	}
	a := g.join(t)
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	st, f, err := openSession(t, sctx, g.client(t, certOf(a)), a.NodeID)
	if err != nil || f.GetWelcome() == nil {
		t.Fatalf("session: %v %v", err, f)
	}
	// An event's ack comes from the session's send loop, which starts once
	// the session's set-up reads are done: the cut below ends no set-up.
	if err := st.Send(&bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_Event{Event: &bcdv1.Event{Seq: 1, Type: "boot", AtUnixMs: time.Now().UnixMilli()}}}); err != nil {
		t.Fatal(err)
	}
	for f.GetAck() == nil {
		if f, err = st.Receive(); err != nil {
			t.Fatalf("waiting for the event's ack: %v", err)
		}
	}
	adm := adminapi.NewClient(g.dir, "", "")
	health := func() adminapi.HealthView {
		h, err := adm.Health(context.Background())
		if err != nil {
			t.Fatalf("admin health: %v", err)
		}
		return h
	}
	if code, body := ready(); code != 200 || body != "ready\n" {
		t.Fatalf("readyz with the database: %d %q", code, body)
	}
	if h := health(); !h.Database.Reachable || h.Database.Backend != "postgresql" || h.Database.Error != "" {
		t.Fatalf("health with the database: %+v", h)
	}

	proxy.Cut()
	waitFor(t, "readyz 503", func() bool { code, _ := ready(); return code == http.StatusServiceUnavailable })
	if code, body := ready(); code != 503 || body != "database unreachable\n" {
		t.Errorf("readyz without the database: %d %q (it must name no detail)", code, body)
	}
	h := health()
	if h.Database.Reachable || !strings.Contains(h.Database.Error, "ping postgres host="+proxy.Dir()) {
		t.Errorf("health without the database: %+v", h.Database)
	}
	for {
		f, err := st.Receive()
		if err != nil {
			t.Fatalf("session without the database: %v before a Drain", err)
		}
		if d := f.GetDrain(); d != nil {
			if d.GetRedialAfterMs() == 0 || !strings.Contains(d.GetReason(), "database") {
				t.Errorf("the Drain of a lost database: %+v", d)
			}
			break
		}
	}
	if n := strings.Count(g.logs.String(), `"msg":"database unreachable`); n != 1 {
		t.Errorf("%d log lines for the lost database, want 1:\n%s", n, g.logs)
	}

	proxy.Open(t)
	waitFor(t, "readyz 200 again", func() bool { code, _ := ready(); return code == 200 })
	if h := health(); !h.Database.Reachable || h.Database.Error != "" || !h.Database.Since.After(h.Database.Checked.Add(-time.Minute)) {
		t.Errorf("health with the database back: %+v", h.Database)
	}
	waitFor(t, "the log line", func() bool { return strings.Contains(g.logs.String(), `"msg":"database reachable again"`) })

	b := startGateway(t, gateway.Config{})
	_, bhc := b.clientHC(t, nil)
	resp, err := bhc.Get(b.url + adminapi.ReadyPath)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz on bbolt: %v %v", resp, err)
	}
	resp.Body.Close()
	if h, err := adminapi.NewClient(b.dir, "", "").Health(context.Background()); err != nil || h.Database.Backend != "bbolt" || !h.Database.Reachable {
		t.Errorf("health on bbolt: %+v %v", h, err)
	}
}
