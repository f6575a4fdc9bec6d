package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/jackc/pgx/v5"
)

// envInt reads a positive int from the environment, def without it.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// TestHAFailoverSoak: BCD_HA_AGENTS bcd sim agents (default 40) join
// through HAProxy in front of BCD_HA_GATEWAYS bcgw (default 2) on one
// PostgreSQL. A steady stream of fakehw.mark commands goes through the
// admin API of a random live gateway, with desired spec changes among
// them (each applied spec sends events), while, BCD_HA_TRIALS times (default
// 3), a random gateway holding sessions is killed with SIGKILL at a random moment, every
// agent is waited for to be connected again (the longest wait is
// printed, and must stay under BCD_HA_RECONNECT_BOUND seconds, default
// 60), and the gateway is started again. At the end every accepted
// command has exactly one stored result, SUCCEEDED; no mark happened
// twice and each SUCCEEDED one happened once; every node's events are
// stored once each with no gap in their seqs. make soak-ha runs 1,000
// agents, 3 gateways and 100 kills.
func TestHAFailoverSoak(t *testing.T) {
	agents := envInt(t, "BCD_HA_AGENTS", 40)
	gws := envInt(t, "BCD_HA_GATEWAYS", 2)
	trials := envInt(t, "BCD_HA_TRIALS", 3)
	bound := time.Duration(envInt(t, "BCD_HA_RECONNECT_BOUND", 60)) * time.Second
	if gws < 2 {
		t.Fatalf("BCD_HA_GATEWAYS=%d: failover needs at least 2", gws)
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	t.Logf("seed %d", seed)

	h := newHALab(t, gws)
	tok := h.token(h.gws[0], "--uses", strconv.Itoa(agents))
	cfg := h.simConfig(h.front(0), "sim")
	simDir := filepath.Join(filepath.Dir(cfg), "data", "sim")
	joinStart := time.Now()
	sim := h.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", strconv.Itoa(agents), "--seed", "1")
	ctx := context.Background()

	var mu sync.Mutex // guards alive and h.gws
	alive := make([]bool, gws)
	for i := range alive {
		alive[i] = true
	}
	admins := make([]*adminapi.Client, gws)
	for i, g := range h.gws {
		admins[i] = adminapi.NewClient(g.dataDir, "", "")
	}
	// connected counts the distinct nodes with a session on a live gateway,
	// each counted by the gateway holding it: every gateway lists the whole
	// fleet, and a gateway just killed is still named for a while.
	connected := func() (int, []string) {
		ids := map[string]bool{}
		for i := range gws {
			mu.Lock()
			ok := alive[i]
			mu.Unlock()
			if !ok {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ns, err := admins[i].Nodes(cctx)
			cancel()
			if err != nil {
				continue
			}
			for _, n := range ns {
				if n.Connected && n.Gateway == h.gwName(i) {
					ids[n.ID] = true
				}
			}
		}
		out := make([]string, 0, len(ids))
		for id := range ids {
			out = append(out, id)
		}
		return len(ids), out
	}
	waitAll := func(limit time.Duration, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			n, _ := connected()
			if n == agents {
				return time.Since(start)
			}
			select {
			case <-sim.done:
				t.Fatalf("bcd sim exited:\n%s", sim.stderr.String())
			default:
			}
			if time.Since(start) > limit {
				t.Fatalf("%s: %d of %d agents connected after %s", what, n, agents, limit)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitAll(10*time.Minute, "joining")
	_, nodes := connected()
	t.Logf("%d agents joined and connected in %s", agents, time.Since(joinStart).Round(time.Second))

	// The command stream: one command every 20-60 ms through a random
	// live gateway, each a mark with up to 400 ms of work around it.
	var accepted []string
	var sendErrs, specs int
	specNodes := map[string]bool{}
	flips := map[string]int{}
	stop := make(chan struct{})
	streamDone := make(chan struct{})
	go func() {
		defer close(streamDone)
		r := rand.New(rand.NewPCG(uint64(seed), 3))
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+r.IntN(40)) * time.Millisecond):
			}
			mu.Lock()
			var live []int
			for i, ok := range alive {
				if ok {
					live = append(live, i)
				}
			}
			mu.Unlock()
			gi := live[r.IntN(len(live))]
			if r.IntN(5) == 0 {
				// A desired spec change: the agent applies it and sends
				// events about it (through whichever gateway it is on).
				node := nodes[r.IntN(len(nodes))]
				// Every other change of a node fails terminally: its section
				// goes failed, then converged, each change an event.
				mu.Lock()
				flips[node]++
				fail := flips[node]%2 == 1
				mu.Unlock()
				sec := map[string]any{"files": map[string]string{"f": strconv.Itoa(r.Int())}}
				if fail {
					sec["fail"] = map[string]any{"mode": "terminal"}
				}
				spec, _ := json.Marshal(map[string]any{"fakehw": sec})
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := admins[gi].SetSpec(sctx, node, spec)
				cancel()
				mu.Lock()
				if err != nil {
					sendErrs++
				} else {
					specs++
					specNodes[node] = true
				}
				mu.Unlock()
				continue
			}
			body := fmt.Sprintf(`{"sleep_ms":%d}`, r.IntN(400))
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			c, err := admins[gi].Send(sctx, adminapi.CommandRequest{Node: nodes[r.IntN(len(nodes))], Kind: "fakehw.mark", Body: json.RawMessage(body)})
			cancel()
			mu.Lock()
			if err != nil {
				sendErrs++ // its gateway was killed under it: not accepted
			} else {
				accepted = append(accepted, c.ID)
			}
			mu.Unlock()
		}
	}()

	var worst time.Duration
	for trial := range trials {
		time.Sleep(time.Duration(300+rng.IntN(1500)) * time.Millisecond)
		// A random gateway among those holding sessions (one holding none
		// proves nothing).
		var holding []int
		held := map[int]int{}
		for i := range gws {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ns, err := admins[i].Nodes(cctx)
			cancel()
			if err != nil {
				t.Fatalf("gw%d nodes: %v", i+1, err)
			}
			for _, n := range ns {
				if n.Connected && n.Gateway == h.gwName(i) {
					held[i]++
				}
			}
			if held[i] > 0 {
				holding = append(holding, i)
			}
		}
		k := holding[rng.IntN(len(holding))]
		mu.Lock()
		alive[k] = false
		mu.Unlock()
		h.gws[k].signal(syscall.SIGKILL)
		h.gws[k].wait(t, 10*time.Second)
		d := waitAll(bound, fmt.Sprintf("trial %d, gw%d killed", trial, k+1))
		worst = max(worst, d)
		t.Logf("trial %d: gw%d killed with %d sessions; every agent connected again in %s", trial, k+1, held[k], d.Round(10*time.Millisecond))
		h.startGW(k)
		mu.Lock()
		alive[k] = true
		mu.Unlock()
	}
	close(stop)
	<-streamDone

	// Every accepted command ends with one result.
	mu.Lock()
	ids := append([]string(nil), accepted...)
	mu.Unlock()
	if len(ids) == 0 {
		t.Fatal("no command was accepted")
	}
	end := time.Now().Add(3 * time.Minute)
	statuses := map[string]int{}
	for _, id := range ids {
		var v adminapi.CommandView
		for {
			var err error
			v, err = admins[0].Command(ctx, id, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if v.State == "done" || time.Now().After(end) {
				break
			}
		}
		statuses[v.Status]++
		if v.State != "done" || v.Status != "SUCCEEDED" || v.ResultCopies < 1 {
			t.Errorf("command %s: %s %s %q (%d result copies)", id, v.State, v.Status, v.Error, v.ResultCopies)
		}
	}
	conn, err := pgx.Connect(ctx, h.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM commands WHERE id = ANY($1) AND state = 'done'`, ids).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(ids) {
		t.Errorf("%d of %d accepted commands are done in PostgreSQL", rows, len(ids))
	}

	// No mark twice; each SUCCEEDED one once.
	marks := marksOf(t, simDir, agents)
	for id, n := range marks {
		if n > 1 {
			t.Errorf("the mark of %s happened %d times", id, n)
		}
	}
	for _, id := range ids {
		if marks[id] != 1 {
			t.Errorf("command %s SUCCEEDED but its mark happened %d times", id, marks[id])
		}
	}

	// Every node given a spec converged on its latest generation.
	mu.Lock()
	specced := make([]string, 0, len(specNodes))
	for n := range specNodes {
		specced = append(specced, n)
	}
	mu.Unlock()
	for _, n := range specced {
		for {
			st, err := admins[0].Status(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if st.SpecGeneration > 0 && st.ObservedGeneration == st.SpecGeneration {
				break
			}
			if time.Now().After(end) {
				t.Errorf("node %s: spec generation %d, applied %d, observed %d (refused %d: %s)", n, st.SpecGeneration, st.AppliedGeneration, st.ObservedGeneration, st.RefusedGeneration, st.SpecError)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// Events: each node's seqs stored once each (the key), with no gap.
	evRows, err := conn.Query(ctx, `SELECT node_id, count(*), min(seq)::text, max(seq)::text FROM events GROUP BY node_id`)
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	for evRows.Next() {
		var node, lo, hi string
		var n int
		if err := evRows.Scan(&node, &n, &lo, &hi); err != nil {
			t.Fatal(err)
		}
		l, _ := strconv.Atoi(lo)
		u, _ := strconv.Atoi(hi)
		if u-l+1 != n {
			t.Errorf("node %s: %d events with seqs %d..%d: some lost", node, n, l, u)
		}
		events += n
	}
	evRows.Close()

	sim.signal(syscall.SIGTERM)
	sim.wait(t, 2*time.Minute)
	mu.Lock()
	failedSends, nSpecs := sendErrs, specs
	mu.Unlock()
	if !t.Failed() {
		fmt.Printf("ha soak: %d agents, %d gateways, %d trials (gateway kills), %d commands accepted (%d sends refused by a dying gateway), results %v, each stored once, no mark twice; every agent connected again within %s (bound %s); %d spec changes, %d events, none lost or doubled\n",
			agents, gws, trials, len(ids), failedSends, statuses, worst.Round(10*time.Millisecond), bound, nSpecs, events)
	}
}
