package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// marksOf counts each command's marks in the fakehw marks.log of the
// first agents sim machines under simDir: a mark made twice is a command
// run twice.
func marksOf(t testing.TB, simDir string, agents int) map[string]int {
	t.Helper()
	marks := map[string]int{}
	for i := range agents {
		f, err := os.Open(filepath.Join(simDir, strconv.Itoa(i), "fakehw", "marks.log"))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if id, _, ok := strings.Cut(sc.Text(), " "); ok {
				marks[id]++
			}
		}
		f.Close()
	}
	return marks
}

// metricValue is the sum of the samples of a metric from bcgw's /metrics
// at addr whose line holds every one of with (a label, le="0.25"); 0
// when it cannot read them.
func metricValue(addr, name string, with ...string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
next:
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, w := range with {
			if !strings.Contains(line, w) {
				continue next
			}
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// storeOps reads the survivor's store calls so far by operation: how many
// (bcgw_store_seconds_count) and their seconds in all (_sum).
func storeOps(addr string) map[string][2]float64 {
	out := map[string][2]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		i := 0
		switch {
		case strings.HasPrefix(line, "bcgw_store_seconds_count{"):
		case strings.HasPrefix(line, "bcgw_store_seconds_sum{"):
			i = 1
		default:
			continue
		}
		_, rest, _ := strings.Cut(line, `op="`)
		op, _, _ := strings.Cut(rest, `"`)
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		x := out[op]
		x[i] = v
		out[op] = x
	}
	return out
}

// printStoreOps prints the store calls between two storeOps readings per
// session taken over (sessions), most calls first: the set-ups' own calls
// with what the new sessions' first frames cost and the marks' calls.
func printStoreOps(label string, from, to map[string][2]float64, sessions int) {
	type row struct {
		op     string
		n, sec float64
	}
	var rows []row
	var n, sec float64
	for op, v := range to {
		d := row{op, v[0] - from[op][0], v[1] - from[op][1]}
		if d.n > 0 {
			rows = append(rows, d)
			n, sec = n+d.n, sec+d.sec
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.n, a.n) })
	per := float64(max(sessions, 1))
	fmt.Printf("scale HA: %s: %.0f store calls (%.1f s) for %d sessions taken over: %.2f calls and %.1f ms a session\n",
		label, n, sec, sessions, n/per, 1000*sec/per)
	for _, r := range rows {
		fmt.Printf("scale HA:   %-22s %8.0f calls %6.2f a session, mean %6.1f ms\n", r.op, r.n, r.n/per, 1000*r.sec/max(r.n, 1))
	}
}

// groupCPU is the CPU time so far of the processes running each program
// (bcgw, bcd-node, postgres, haproxy, the test binary, ...), from
// /proc/PID/stat; a process that exited takes its share with it.
func groupCPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, pid := range procPIDs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if i < 0 || j < i {
			continue
		}
		if d := procCPU(pid); d > 0 {
			out[s[i+1:j]] += d
		}
	}
	return out
}

// printGroupCPU prints each program's CPU between two groupCPU readings
// over the window d, most first, in cores.
func printGroupCPU(label string, from, to map[string]time.Duration, d time.Duration) {
	type row struct {
		name string
		cpu  time.Duration
	}
	var rows []row
	var all time.Duration
	for name, v := range to {
		if x := v - from[name]; x > 100*time.Millisecond {
			rows = append(rows, row{name, x})
			all += x
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Compare(b.cpu, a.cpu) })
	fmt.Printf("scale HA: %s: CPU by program over %s: %.1f s in all (%.2f cores)", label, d.Round(time.Second), all.Seconds(), all.Seconds()/d.Seconds())
	for _, r := range rows {
		fmt.Printf("; %s %.1f s", r.name, r.cpu.Seconds())
	}
	fmt.Println()
}

// printWaits prints what PostgreSQL's active backends were seen waiting
// for (pgWaits), most first.
func printWaits(label string, counts map[string]int) {
	type row struct {
		wait string
		n    int
	}
	var rows []row
	all := 0
	for w, n := range counts {
		rows = append(rows, row{w, n})
		all += n
	}
	slices.SortFunc(rows, func(a, b row) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.wait, b.wait)) })
	fmt.Printf("scale HA: %s: PostgreSQL's active backends, sampled every 0.5 s: %d seen", label, all)
	for _, r := range rows {
		fmt.Printf("; %s %d", r.wait, r.n)
	}
	fmt.Println()
}

// slowShare is where the slow round trips of a window were slow, from the
// survivor's histograms: of the commands whose result was stored, how
// many took over 250 ms from being sent on the session to their result
// stored (the agent's share and the result's store call), and of the
// store calls, how many took over 250 ms.
type slowShare struct{ sent, sentSlow, calls, callsSlow float64 }

func readSlowShare(addr string) slowShare {
	return slowShare{
		sent:      metricValue(addr, "bcgw_command_round_trip_seconds_count"),
		sentSlow:  metricValue(addr, "bcgw_command_round_trip_seconds_count") - metricValue(addr, "bcgw_command_round_trip_seconds_bucket", `le="0.25"`),
		calls:     metricValue(addr, "bcgw_store_seconds_count"),
		callsSlow: metricValue(addr, "bcgw_store_seconds_count") - metricValue(addr, "bcgw_store_seconds_bucket", `le="0.25"`),
	}
}

// BenchmarkScaleHA is make bench-scale: BCD_SCALE_NODES bcd sim agents
// (10,000 by default) join through HAProxy, configured as
// build/haproxy.cfg (the documented configuration), in front of two bcgw
// on one durable PostgreSQL. It measures the control round trip (p99,
// p99.9 and max of measuredTrips agent.pings), then kills the gateway
// holding more sessions with SIGKILL while fakehw.mark commands go through
// the other every 50 ms, and measures how long until every agent is
// connected again (failover-s), and, the marks stopped, the round trip
// again. At the end every
// accepted command must be done, SUCCEEDED, and its mark made once: the
// commands lost and run twice are printed (and fail the run). The
// PostgreSQL pool's waits on the survivor during each measurement are
// printed beside it (bcgw_store_pool_wait_seconds_total).
func BenchmarkScaleHA(b *testing.B) {
	n := scaleEnv(b, "BCD_SCALE_NODES", 10000)
	connectWait := time.Duration(scaleEnv(b, "BCD_SCALE_CONNECT_MINUTES", 30)) * time.Minute
	failoverWait := 10 * time.Minute
	c, err := pgtest.StartDurable()
	if errors.Is(err, pgtest.ErrNoPostgres) {
		testenv.Skip(b, "%v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Stop)
	ctx := context.Background()
	url, err := c.NewDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	load := func() string {
		l, _ := os.ReadFile("/proc/loadavg")
		return strings.Join(strings.Fields(string(l))[:3], " ")
	}
	fmt.Printf("scale HA: %d agents, two bcgw behind HAProxy (build/haproxy.cfg), load average %s at the start\n", n, load())
	// Room for the agents and their redials.
	h := newHALabOn(b, url, 2, n+n/2+256, "--metrics", "127.0.0.1:0", "--profile")
	metricsAt := func(i int) string {
		m := h.gws[i].waitLog(b, "bcgw serving", 10*time.Second)
		a, _ := m["metrics_addr"].(string)
		return a
	}
	admins := []*adminapi.Client{adminapi.NewClient(h.gws[0].dataDir, "", ""), adminapi.NewClient(h.gws[1].dataDir, "", "")}
	// held is how many sessions each gateway holds, and their node ids.
	held := func(alive []int) (map[int]int, []string) {
		per := map[int]int{}
		var ids []string
		for _, i := range alive {
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			ns, err := admins[i].Nodes(cctx)
			cancel()
			if err != nil {
				continue
			}
			for _, x := range ns {
				if x.Connected && x.Gateway == h.gwName(i) {
					per[i]++
					ids = append(ids, x.ID)
				}
			}
		}
		return per, ids
	}
	tok := h.token(h.gws[0], "--uses", strconv.Itoa(n))
	cfg := h.simConfig(h.front(0), "sim")
	simDir := filepath.Join(filepath.Dir(cfg), "data", "sim")
	start := time.Now()
	sim := h.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", strconv.Itoa(n), "--seed", "1")
	var ids []string
	var per map[int]int
	for end := time.Now().Add(connectWait); ; time.Sleep(5 * time.Second) {
		per, ids = held([]int{0, 1})
		if len(ids) >= n {
			break
		}
		select {
		case <-sim.done:
			b.Fatalf("bcd sim exited:\n%s", sim.stderr.String())
		default:
		}
		if time.Now().After(end) {
			b.Fatalf("only %d of %d agents connected after %s", len(ids), n, connectWait)
		}
	}
	fmt.Printf("scale HA: all %d connected in %s (gw1 %d, gw2 %d), load average %s\n", n, time.Since(start).Round(time.Second), per[0], per[1], load())
	time.Sleep(20 * time.Second) // the first reports go out
	// Idle: both gateways' CPU over a minute with every session up and
	// nothing sent, per 1,000 sessions.
	c0, c1, g0, t0 := procCPU(h.gws[0].cmd.Process.Pid), procCPU(h.gws[1].cmd.Process.Pid), groupCPU(), time.Now()
	if profDir := os.Getenv("BCD_SCALE_PROFILES"); profDir != "" {
		// gw1's CPU profile of the idle minute (go tool pprof).
		if err := os.MkdirAll(profDir, 0o755); err != nil {
			b.Fatal(err)
		}
		if resp, err := http.Get("http://" + metricsAt(0) + "/debug/pprof/profile?seconds=60"); err == nil {
			if f, err := os.Create(filepath.Join(profDir, "cpu-idle.pb.gz")); err == nil {
				_, _ = io.Copy(f, resp.Body)
				f.Close()
			}
			resp.Body.Close()
		}
	}
	time.Sleep(time.Until(t0.Add(time.Minute)))
	idle := (procCPU(h.gws[0].cmd.Process.Pid) - c0 + procCPU(h.gws[1].cmd.Process.Pid) - c1).Seconds() / time.Since(t0).Minutes()
	printGroupCPU("idle", g0, groupCPU(), time.Since(t0))
	fmt.Printf("scale HA: idle: both gateways %.2f CPU s/min for %d sessions, %.2f per 1,000; load average %s\n", idle, n, 1000*idle/float64(n), load())

	kill := 0
	if per[1] > per[0] {
		kill = 1
	}
	surv := 1 - kill
	survMetrics := metricsAt(surv)
	// BCD_SCALE_PROFILES, a directory: the survivor's execution trace of
	// 20 s of each measurement, and its blocking, lock and goroutine
	// profiles after it (bcgw serve --profile), for go tool trace/pprof.
	profDir := os.Getenv("BCD_SCALE_PROFILES")
	save := func(path, name string) {
		resp, err := http.Get("http://" + survMetrics + "/debug/pprof/" + path)
		if err != nil {
			b.Logf("profile %s: %v", path, err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(profDir, name))
		if err != nil {
			b.Logf("profile %s: %v", path, err) // also called off the benchmark's goroutine
			return
		}
		defer f.Close()
		_, _ = io.Copy(f, resp.Body)
	}
	trips := func(label string) latency {
		var traced sync.WaitGroup
		if profDir != "" {
			if err := os.MkdirAll(profDir, 0o755); err != nil {
				b.Fatal(err)
			}
			traced.Add(1)
			go func() { defer traced.Done(); save("trace?seconds=20", "trace-"+label+".out") }()
		}
		w0, s0, t0 := metricValue(survMetrics, "bcgw_store_pool_wait_seconds_total"), readSlowShare(survMetrics), time.Now()
		l := roundTrips(b, admins[surv], ids, measuredTrips)
		s1 := readSlowShare(survMetrics)
		fmt.Printf("scale HA: %s: on the survivor, %.0f of %.0f commands took over 250 ms from sent on the session to result stored; %.0f of %.0f store calls took over 250 ms\n",
			label, s1.sentSlow-s0.sentSlow, s1.sent-s0.sent, s1.callsSlow-s0.callsSlow, s1.calls-s0.calls)
		traced.Wait()
		if profDir != "" {
			save("block", "block-"+label+".pb.gz")
			save("mutex", "mutex-"+label+".pb.gz")
			save("goroutine?debug=1", "goroutine-"+label+".txt")
		}
		w1 := metricValue(survMetrics, "bcgw_store_pool_wait_seconds_total")
		fmt.Printf("scale HA: %s: %d round trips through gw%d in %s: p50 %s p99 %s p99.9 %s max %s; the survivor's store calls waited %.2f s in all for a pool connection; load average %s\n",
			label, measuredTrips, surv+1, time.Since(t0).Round(time.Second), l.p50, l.p99, l.p999, l.max, w1-w0, load())
		return l
	}
	before := trips("before")

	// The command stream through the survivor, through the kill.
	var mu sync.Mutex
	var accepted []string
	refused := 0
	stop, streamDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(streamDone)
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			cmd, err := admins[surv].Send(sctx, adminapi.CommandRequest{Node: ids[r.IntN(len(ids))], Kind: "fakehw.mark", Body: json.RawMessage(`{"sleep_ms":100}`)})
			cancel()
			mu.Lock()
			if err != nil {
				refused++
			} else {
				accepted = append(accepted, cmd.ID)
			}
			mu.Unlock()
		}
	}()
	time.Sleep(2 * time.Second)
	fmt.Printf("scale HA: killing gw%d (%d sessions) with SIGKILL; load average %s\n", kill+1, per[kill], load())
	ops0 := storeOps(survMetrics)
	reasons := []string{"setup_queue", "handshake_queue", "busy", "draining"}
	refusals := func() []float64 {
		var out []float64
		for _, r := range reasons {
			out = append(out, metricValue(survMetrics, "bcgw_session_refusals_total", `reason="`+r+`"`))
		}
		return out
	}
	ref0 := refusals()
	killed := time.Now()
	h.gws[kill].signal(syscall.SIGKILL)
	h.gws[kill].wait(b, 10*time.Second)
	cpu0, waits := groupCPU(), pgWaits(ctx, url)
	profiled := make(chan struct{})
	go func() {
		// The survivor's CPU profile of the failover's first 30 s.
		defer close(profiled)
		if profDir != "" {
			save("profile?seconds=30", "cpu-failover.pb.gz")
		}
	}()
	// Every agent is back when the survivor holds n sessions (its
	// bcgw_sessions gauge, read each second: cheap, where the admin
	// API's node list reads every record), and the node list, read
	// once then, shows each connected through it.
	var back int
	var timeline []string
	for {
		s := int(metricValue(survMetrics, "bcgw_sessions"))
		if el := time.Since(killed); len(timeline) < int(el/(5*time.Second)) {
			timeline = append(timeline, fmt.Sprintf("%ds %d", int(el.Seconds()), s))
		}
		if s >= n {
			p, got := held([]int{surv})
			if back = p[surv]; len(got) >= n {
				break
			}
		}
		if time.Since(killed) > failoverWait {
			p, _ := held([]int{surv})
			back = p[surv]
			break
		}
		time.Sleep(time.Second)
	}
	failover := time.Since(killed)
	cpu1 := groupCPU()
	fmt.Printf("scale HA: %d of %d agents connected again %s after the kill; load average %s\n", back, n, failover.Round(100*time.Millisecond), load())
	fmt.Printf("scale HA: the survivor's sessions after the kill: %s\n", strings.Join(timeline, ", "))
	printGroupCPU("failover", cpu0, cpu1, failover)
	printWaits("failover", waits())
	ref1 := refusals()
	var refusedBy []string
	for i, r := range reasons {
		refusedBy = append(refusedBy, fmt.Sprintf("%s %.0f", r, ref1[i]-ref0[i]))
	}
	fmt.Printf("scale HA: failover: the survivor refused %s\n", strings.Join(refusedBy, ", "))
	<-profiled
	printStoreOps("failover", ops0, storeOps(survMetrics), back-per[surv])
	close(stop)
	<-streamDone
	after := trips("after")

	// Every accepted command done once, its mark made once.
	mu.Lock()
	cmds := append([]string(nil), accepted...)
	mu.Unlock()
	lost := map[string]bool{}
	end := time.Now().Add(3 * time.Minute)
	for _, id := range cmds {
		var v adminapi.CommandView
		for {
			v, err = admins[surv].Command(ctx, id, 10*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			if v.State == "done" || time.Now().After(end) {
				break
			}
		}
		if v.State != "done" || v.Status != "SUCCEEDED" {
			lost[id] = true
		}
	}
	marks := marksOf(b, simDir, n)
	twice := 0
	for _, id := range cmds {
		switch {
		case marks[id] > 1:
			twice++
		case marks[id] == 0:
			lost[id] = true // SUCCEEDED without its mark, or never run
		}
	}
	sim.signal(syscall.SIGTERM)
	sim.wait(b, 5*time.Minute)

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("bench-scale: %d agents, two bcgw behind HAProxy (build/haproxy.cfg), one killed, on %d cores (load average %s at the end):\n", n, numCPU(), load())
	fmt.Printf("  %-44s %10.1f s    (budget <= 60)\n", "failover: all agents back after the kill", failover.Seconds())
	fmt.Printf("  %-44s %10.2f\n", "idle gateway CPU s/min per 1,000 sessions", 1000*idle/float64(n))
	fmt.Printf("  %-44s %10d      (%d sends refused)\n", "commands accepted during the failover", len(cmds), refused)
	fmt.Printf("  %-44s %10d      (budget 0)\n", "commands lost", len(lost))
	fmt.Printf("  %-44s %10d      (budget 0)\n", "commands run twice", twice)
	for _, r := range []struct {
		name string
		l    latency
	}{{"before the kill", before}, {"after the kill", after}} {
		fmt.Printf("  %-44s %10.1f ms   (budget <= 250)\n", "round trip p99, "+r.name, ms(r.l.p99))
		fmt.Printf("  %-44s %10.1f ms\n", "round trip p99.9, "+r.name, ms(r.l.p999))
		fmt.Printf("  %-44s %10.1f ms\n", "round trip max, "+r.name, ms(r.l.max))
	}
	b.ReportMetric(failover.Seconds(), "failover-s")
	b.ReportMetric(ms(max(before.p99, after.p99)), "p99-ms")
	b.ReportMetric(ms(before.p99), "p99-before-ms")
	b.ReportMetric(ms(after.p99), "p99-after-ms")
	b.ReportMetric(ms(max(before.p999, after.p999)), "p99.9-ms")
	b.ReportMetric(ms(max(before.max, after.max)), "max-ms")
	b.ReportMetric(float64(len(lost)), "lost")
	b.ReportMetric(float64(twice), "twice")
	b.ReportMetric(float64(n), "agents")
	b.ReportMetric(1000*idle/float64(n), "idle-cpu-s/min/1k")
	if back < n || len(lost) > 0 || twice > 0 {
		b.Errorf("failover: %d of %d agents back after %s, %d commands lost, %d run twice", back, n, failover.Round(time.Second), len(lost), twice)
	}
}
