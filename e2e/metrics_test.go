package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// sample finds one sample's value in Prometheus text: name and its
// labels as the text writes them (name{a="b",...}).
func sample(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// curlMetrics is `curl -sf http://ADDR/metrics`.
func curlMetrics(t *testing.T, addr string) string {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.Skip(t, "no curl: %v", err)
	}
	out, err := exec.Command("curl", "-sSf", "--max-time", "10", "http://"+addr+"/metrics").Output()
	if err != nil {
		t.Fatalf("curl of bcgw's metrics: %v", err)
	}
	return string(out)
}

var storeBucketRe = regexp.MustCompile(`(?m)^bcgw_store_seconds_bucket\{gateway="gw-sim",op="([A-Za-z]+)",le="([^"]+)"\} (\d+)$`)

// TestGatewayMetricsWithSim: bcgw serve --metrics on a bare port; while
// bcd sim runs 200 agents against it, curl of its metrics shows 200
// sessions, the 200 joins, the round trips of 20 commands in their
// histogram and the store's latency histogram, all labelled with the
// gateway's name.
func TestGatewayMetricsWithSim(t *testing.T) {
	const n = 200
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0", "--metrics", "0", "--name", "gw-sim")
	addr, _ := g.waitLog(t, "bcgw serving", 5*time.Second)["metrics_addr"].(string)
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("metrics address %q, want loopback", addr)
	}
	if s, ok := sample(curlMetrics(t, addr), `bcgw_sessions{gateway="gw-sim"}`); !ok || s != 0 {
		t.Fatalf("before the agents: bcgw_sessions %v (%v)", s, ok)
	}

	tok := l.token(g, "--uses", fmt.Sprint(n))
	cfg := l.simConfig(g, "sim")
	l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "38")
	var ids []string
	for end := time.Now().Add(3 * time.Minute); ; time.Sleep(250 * time.Millisecond) {
		ids = ids[:0]
		for _, x := range l.nodes(g) {
			if x.Connected {
				ids = append(ids, x.ID)
			}
		}
		if len(ids) == n {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d agents connected within 3 minutes", len(ids), n)
		}
	}
	ac := adminapi.NewClient(g.dataDir, "", "")
	ctx := context.Background()
	for i := range 20 {
		c, err := ac.Send(ctx, adminapi.CommandRequest{Node: ids[i*7%n], Kind: "agent.ping"})
		if err != nil {
			t.Fatal(err)
		}
		for c.State != "done" {
			if c, err = ac.Command(ctx, c.ID, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A result is visible in the store a moment before it is counted.
	var text string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		text = curlMetrics(t, addr)
		if v, _ := sample(text, `bcgw_command_round_trip_seconds_count{gateway="gw-sim"}`); v == 20 {
			break
		}
	}
	for _, c := range []struct {
		series string
		ok     func(float64) bool
		want   string
	}{
		{`bcgw_sessions{gateway="gw-sim"}`, func(v float64) bool { return v == n }, "200"},
		{`bcgw_joins_total{gateway="gw-sim",role="node"}`, func(v float64) bool { return v == n }, "200"},
		{`bcgw_database_up{gateway="gw-sim"}`, func(v float64) bool { return v == 1 }, "1"},
		{`bcgw_command_round_trip_seconds_count{gateway="gw-sim"}`, func(v float64) bool { return v == 20 }, "20"},
		{`bcgw_command_round_trip_seconds_bucket{gateway="gw-sim",le="+Inf"}`, func(v float64) bool { return v == 20 }, "20"},
		{`bcgw_store_seconds_count{gateway="gw-sim",op="StartSession"}`, func(v float64) bool { return v >= n }, "at least 200 (a session each)"},
		{`bcgw_store_seconds_count{gateway="gw-sim",op="SetResult"}`, func(v float64) bool { return v >= 20 }, "at least 20"},
		{`bcgw_results_pending_ack{gateway="gw-sim"}`, func(v float64) bool { return v == 0 }, "0"},
	} {
		v, found := sample(text, c.series)
		if !found || !c.ok(v) {
			t.Errorf("%s = %v (found %v), want %s", c.series, v, found, c.want)
		}
	}
	// The store's histogram: buckets that only grow, the last holding
	// every operation.
	ops := map[string][]int{}
	for _, m := range storeBucketRe.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.Atoi(m[3])
		ops[m[1]] = append(ops[m[1]], v)
	}
	if len(ops) < 5 {
		t.Errorf("the store's latency histogram has %d operations: %v", len(ops), ops)
	}
	for op, bs := range ops {
		for i := 1; i < len(bs); i++ {
			if bs[i] < bs[i-1] {
				t.Errorf("op %s: buckets %v are not cumulative", op, bs)
				break
			}
		}
	}
	prometheusScrapes(t, l, addr, n)

	rt := regexp.MustCompile(`(?m)^bcgw_command_round_trip_seconds_bucket.*$`).FindAllString(text, -1)
	st := regexp.MustCompile(`(?m)^bcgw_store_seconds_bucket\{gateway="gw-sim",op="SetResult".*$`).FindAllString(text, -1)
	t.Logf("curl http://%s/metrics while bcd sim runs %d agents:\n%s\n%s\n%s", addr, n,
		strings.Join(regexp.MustCompile(`(?m)^bcgw_(sessions|joins_total|database_up).*$`).FindAllString(text, -1), "\n"),
		strings.Join(rt, "\n"), strings.Join(st, "\n"))
}

// prometheusScrapes runs Debian's Prometheus (build/deps.sh installs it)
// on loopback, scraping bcgw every second, and waits until its own query
// API answers sum(bcgw_sessions) = sessions: a real scraper takes the
// text as bcgw writes it.
func prometheusScrapes(t *testing.T, l *lab, target string, sessions int) {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		testenv.Skip(t, "no prometheus (Debian's package): %v", err)
	}
	dir := filepath.Join(l.root, "prometheus")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "prometheus.yml")
	body := fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: bcgw\n    static_configs:\n      - targets: [%q]\n", target)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	web := freeAddr(t)
	cmd := exec.Command(bin, "--config.file", cfg, "--storage.tsdb.path", filepath.Join(dir, "data"), "--web.listen-address", web)
	se := &syncBuf{name: "prometheus (stderr)"}
	l.out.add(se)
	cmd.Stdout, cmd.Stderr = se, se
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	query := func(q string) (float64, string) {
		resp, err := http.Get("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return -1, err.Error()
		}
		defer resp.Body.Close()
		var r struct {
			Status string
			Data   struct {
				Result []struct {
					Value [2]any
				}
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Status != "success" || len(r.Data.Result) != 1 {
			return -1, fmt.Sprintf("%s %+v %v", resp.Status, r, err)
		}
		v, _ := r.Data.Result[0].Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return -1, v
		}
		return f, ""
	}
	var last string
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		v, why := query("sum(bcgw_sessions)")
		if v == float64(sessions) {
			break
		}
		last = fmt.Sprintf("%v %s", v, why)
		select {
		case <-done:
			t.Fatalf("prometheus exited:\n%s", se.String())
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("Prometheus did not see %d sessions within 60s (last: %s):\n%s", sessions, last, se.String())
		}
	}
	if v, why := query(`count(bcgw_store_seconds_bucket{op="StartSession"})`); v < 10 {
		t.Errorf("Prometheus has %v buckets of the store's StartSession latency (%s)", v, why)
	}
	if v, why := query(`up{job="bcgw"}`); v != 1 {
		t.Errorf("Prometheus: up{job=\"bcgw\"} = %v (%s)", v, why)
	}
	t.Logf("Prometheus %s scraping %s: sum(bcgw_sessions) = %d", bin, target, sessions)
}
