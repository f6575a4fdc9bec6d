package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/journal"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// TestExactlyOnceUnderKills kills bcd node with SIGKILL at random points
// while commands with a side effect (each appends its id to a marker file)
// run, and every fifth trial kills bcgw too; both are started again on
// the same data directories. In every trial no side effect happened twice,
// and at the end every command has exactly one stored result at bcgw.
// BCD_FAULT_TRIALS sets the number of trials (make soak runs 1,000).
func TestExactlyOnceUnderKills(t *testing.T) {
	trials := 12
	if v := os.Getenv("BCD_FAULT_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BCD_FAULT_TRIALS=%q", v)
		}
		trials = n
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	t.Logf("seed %d", seed)

	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	marks := filepath.Join(filepath.Dir(cfg), "data", "fakehw", "marks.log")
	admin := adminapi.NewClient(gwDir, "", "")
	ctx := context.Background()

	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	var all []string
	gwKills := 0
	for trial := range trials {
		for range 3 {
			kind := "fakehw.mark"
			if rng.IntN(3) == 0 {
				kind = "fakehw.mark-bulk"
			}
			body := fmt.Sprintf(`{"sleep_ms":%d}`, rng.IntN(120))
			c, err := admin.Send(ctx, adminapi.CommandRequest{Node: id, Kind: kind, Body: json.RawMessage(body)})
			if err != nil {
				t.Fatalf("trial %d: send: %v", trial, err)
			}
			all = append(all, c.ID)
		}
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond)
		select {
		case <-node.done:
			// An agent that cannot start again after a kill is the worst
			// outcome of all: stop here and say why.
			t.Fatalf("trial %d: bcd node exited by itself after a restart:\n%s", trial, node.stderr.String())
		default:
		}
		node.signal(syscall.SIGKILL)
		node.wait(t, 10*time.Second)
		if trial%5 == 4 {
			g.signal(syscall.SIGKILL)
			g.wait(t, 10*time.Second)
			g = l.startGateway(gwDir, g.addr)
			gwKills++
		}
		checkMarks(t, marks, trial)
		node = l.start("bcd-node", "node", "--config", cfg)
	}

	// Everything settles: every command gets a result.
	end := time.Now().Add(2 * time.Minute)
	statuses := map[string]int{}
	for _, cid := range all {
		var c adminapi.CommandView
		for {
			var err error
			if c, err = admin.Command(ctx, cid, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if c.State == "done" || time.Now().After(end) {
				break
			}
		}
		if c.State != "done" {
			// What does the node's journal say? Stop the node to read it.
			node.signal(syscall.SIGTERM)
			node.wait(t, 15*time.Second)
			j, _, err := journal.Open(filepath.Join(filepath.Dir(cfg), "data", journal.File), id)
			if err == nil {
				e, _ := j.Get(cid)
				un, _ := j.Unacked()
				t.Logf("journal entry: %+v; %d unacked results", e, len(un))
				j.Close()
			}
			t.Fatalf("command %s has no result: %+v", cid, c)
		}
		statuses[c.Status]++
		if c.ResultCopies < 1 {
			t.Errorf("command %s: done with %d result copies", cid, c.ResultCopies)
		}
		switch c.Status {
		case "SUCCEEDED", "INTERRUPTED":
		default:
			t.Errorf("command %s ended %s: %s", cid, c.Status, c.Error)
		}
	}
	counts := checkMarks(t, marks, trials)
	for _, cid := range all {
		c, _ := admin.Command(ctx, cid, 0)
		if c.Status == "SUCCEEDED" && counts[cid] != 1 {
			t.Errorf("command %s SUCCEEDED but its side effect happened %d times", cid, counts[cid])
		}
	}
	t.Logf("%d trials (%d with bcgw killed too), %d commands: %v", trials, gwKills, len(all), statuses)
	if !t.Failed() {
		fmt.Printf("fault test: %d trials, %d bcgw kills, %d commands, results %v, no side effect twice, every result stored once\n", trials, gwKills, len(all), statuses)
	}
}

// checkMarks fails when any command's side effect happened more than once
// and returns how many times each happened.
func checkMarks(t *testing.T, path string, trial int) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			counts[f[0]]++
			if counts[f[0]] == 2 {
				t.Errorf("trial %d: the side effect of %s happened twice", trial, f[0])
			}
		}
	}
	return counts
}

// TestConvergeUnderKills kills bcd node with SIGKILL at random points
// while its fakehw section writes the files of a new spec generation
// (each write slowed down), and starts it again. After every kill, on
// disk: the observed generation is at most the held one, and when it
// equals it every file holds that generation's content (the observed
// generation never runs ahead of what is applied). Over all trials no
// file content was written twice (a side effect re-checked, not
// repeated), and at the end the last generation is observed with every
// file in place. BCD_FAULT_TRIALS sets the number of trials (make soak).
func TestConvergeUnderKills(t *testing.T) {
	trials := 4
	if v := os.Getenv("BCD_FAULT_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("BCD_FAULT_TRIALS=%q", v)
		}
		trials = n
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	t.Logf("seed %d", seed)
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	files := filepath.Join(data, "fakehw", "section")
	const nFiles = 6
	specFor := func(trial int) string {
		m := map[string]string{}
		for i := range nFiles {
			m[fmt.Sprintf("f%d", i)] = fmt.Sprintf("trial %d file %d", trial, i)
		}
		b, _ := json.Marshal(map[string]any{"fakehw": map[string]any{"files": m, "apply_delay_ms": 25}})
		return string(b)
	}
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	var last uint64
	ahead := 0
	for trial := range trials {
		last = l.spec(g, "set", id, specFor(trial))
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond)
		node.signal(syscall.SIGKILL)
		node.wait(t, 10*time.Second)
		// What the agent left on disk.
		var held struct {
			Generation uint64          `json:"generation"`
			Spec       json.RawMessage `json:"spec"`
		}
		var obs struct {
			Observed uint64 `json:"observed_generation"`
		}
		b, _ := os.ReadFile(filepath.Join(data, "spec.json"))
		_ = json.Unmarshal(b, &held)
		if b, err := os.ReadFile(filepath.Join(data, "converge.json")); err == nil {
			_ = json.Unmarshal(b, &obs)
		}
		if obs.Observed > held.Generation {
			t.Fatalf("trial %d: observed %d is ahead of the held generation %d", trial, obs.Observed, held.Generation)
		}
		if obs.Observed == held.Generation && held.Generation > 0 {
			var spec struct {
				Fakehw struct {
					Files map[string]string `json:"files"`
				} `json:"fakehw"`
			}
			_ = json.Unmarshal(held.Spec, &spec)
			for name, want := range spec.Fakehw.Files {
				if got := readFile(t, filepath.Join(files, name)); got != want {
					t.Fatalf("trial %d: generation %d observed, but %s = %q, want %q", trial, obs.Observed, name, got, want)
				}
			}
		} else {
			ahead++
		}
		node = l.start("bcd-node", "node", "--config", cfg)
	}
	l.waitStatus(g, id, "the last generation observed", func(s adminapi.StatusView) bool { return s.ObservedGeneration == last })
	for i := range nFiles {
		if got, want := readFile(t, filepath.Join(files, fmt.Sprintf("f%d", i))), fmt.Sprintf("trial %d file %d", trials-1, i); got != want {
			t.Errorf("f%d = %q, want %q", i, got, want)
		}
	}
	for line, n := range sectionLog(t, data) {
		if strings.Count(line, " ") == 2 && n > 1 {
			t.Errorf("%q happened %d times", line, n)
		}
	}
	if !t.Failed() {
		fmt.Printf("converge fault test: %d trials, %d killed inside an apply (observed behind held), no content written twice, the last generation observed\n", trials, ahead)
	}
}
