package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/machine/fakekinds"
)

// specFile writes a spec for bcgw spec set/patch and returns its path.
func (l *lab) specFile(name, body string) string {
	l.t.Helper()
	p := filepath.Join(l.root, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// spec runs bcgw spec set or patch and returns the new generation.
func (l *lab) spec(g *gw, verb, node, body string) uint64 {
	l.t.Helper()
	out := l.bcgw(g, "spec", verb, node, "--file", l.specFile("spec-"+strconv.Itoa(len(body))+".json", body))
	gen, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
	if err != nil {
		l.t.Fatalf("bcgw spec %s printed %q", verb, out)
	}
	return gen
}

// gwStatus is bcgw status NODE --json.
func (l *lab) gwStatus(g *gw, node string) adminapi.StatusView {
	l.t.Helper()
	var st adminapi.StatusView
	if err := json.Unmarshal([]byte(l.bcgw(g, "status", node, "--json")), &st); err != nil {
		l.t.Fatal(err)
	}
	return st
}

// waitStatus waits (up to 30 s) until cond holds for bcgw status NODE.
func (l *lab) waitStatus(g *gw, node, what string, cond func(adminapi.StatusView) bool) adminapi.StatusView {
	l.t.Helper()
	var st adminapi.StatusView
	end := time.Now().Add(30 * time.Second)
	for time.Now().Before(end) {
		if st = l.gwStatus(g, node); cond(st) {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	l.t.Fatalf("node %s: %s: not within 30 s; bcgw status:\n%s", node, what, b)
	return st
}

func section(st adminapi.StatusView, name string) adminapi.SectionView {
	for _, s := range st.Sections {
		if s.Name == name {
			return s
		}
	}
	return adminapi.SectionView{}
}

// bcdStatus is bcd status --json's desired-state part.
type bcdStatus struct {
	Converge struct {
		Applied   uint64 `json:"applied_generation"`
		Observed  uint64 `json:"observed_generation"`
		SpecError string `json:"spec_error"`
		Sections  []struct {
			Name, State string
			Generation  uint64
		}
	}
}

func (l *lab) bcdStatus(cfg string) bcdStatus {
	l.t.Helper()
	code, out, errOut := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	var st bcdStatus
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		l.t.Fatalf("bcd status --json: exit %d %v\n%s%s", code, err, out, errOut)
	}
	return st
}

// sectionLog counts the fakehw section's writes and removals by line and
// by "write NAME" (any content).
func sectionLog(t *testing.T, dataDir string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, fakekinds.SectionLog))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		m[line]++
		if f := strings.Fields(line); len(f) == 3 {
			m[f[0]+" "+f[1]]++
		}
	}
	return m
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// TestDesiredState: bcgw spec set on a fakehw node converges its fakehw
// section, the observed generation reaches the spec's, bcgw status and
// bcd status show it; a patch moves it one generation on; a spec the
// agent refuses leaves the held one; retryable failures retry, a
// terminal one fails and the generation still advances; the events
// reach bcgw.
func TestDesiredState(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	files := filepath.Join(data, fakekinds.SectionDir)
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	gen := l.spec(g, "set", id, `{"fakehw":{"files":{"a":"1"}}}`)
	st := l.waitStatus(g, id, "observed the first spec", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	if s := section(st, "fakehw"); s.State != "CONVERGED" || s.Generation != gen || st.AppliedGeneration != gen {
		t.Fatalf("bcgw status after set: %+v", st)
	}
	if got := readFile(t, filepath.Join(files, "a")); got != "1" {
		t.Fatalf("file a = %q", got)
	}
	bs := l.bcdStatus(cfg)
	fakehwState := ""
	for _, x := range bs.Converge.Sections {
		if x.Name == "fakehw" {
			fakehwState = x.State
		}
	}
	if bs.Converge.Applied != gen || bs.Converge.Observed != gen || fakehwState != "CONVERGED" {
		t.Fatalf("bcd status: %+v", bs.Converge)
	}
	if code, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg); code != 0 || !strings.Contains(out, "applied "+strconv.FormatUint(gen, 10)) || !strings.Contains(out, "fakehw") {
		t.Errorf("bcd status text: %s", out)
	}
	if code, out, _ := l.run("", nil, "bcgw", "status", id, "--data-dir", g.dataDir); code != 0 || !strings.Contains(out, "CONVERGED") {
		t.Errorf("bcgw status text: %s", out)
	}

	// A patch: one generation on, both files, a written once.
	gen2 := l.spec(g, "patch", id, `{"fakehw":{"files":{"b":"2"}}}`)
	if gen2 != gen+1 {
		t.Fatalf("patch made generation %d after %d", gen2, gen)
	}
	l.waitStatus(g, id, "observed the patch", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen2 })
	if a, b := readFile(t, filepath.Join(files, "a")), readFile(t, filepath.Join(files, "b")); a != "1" || b != "2" {
		t.Fatalf("after the patch: a=%q b=%q", a, b)
	}
	if n := sectionLog(t, data); n["write a"] != 1 || n["write b"] != 1 {
		t.Errorf("side effects %v, want one write of each file", n)
	}

	// The gateway refuses what is no NodeSpec; the agent refuses a section
	// body it cannot read, holding the spec before it.
	if code, _, errOut := l.run("", nil, "bcgw", "spec", "set", id, "--file", l.specFile("bad.json", `{"gpus":{}}`), "--data-dir", g.dataDir); code == 0 || !strings.Contains(errOut, "unknown section") {
		t.Errorf("bcgw spec set with an unknown section: exit %d %s", code, errOut)
	}
	bad := l.spec(g, "set", id, `{"fakehw":{"filez":{"c":"3"}}}`)
	st = l.waitStatus(g, id, "refused the bad section", func(s adminapi.StatusView) bool { return s.RefusedGeneration == bad })
	if !strings.Contains(st.SpecError, "filez") || st.AppliedGeneration != gen2 || st.ObservedGeneration != gen2 {
		t.Fatalf("after a refused spec: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(files, "c")); err == nil {
		t.Error("a refused spec was applied")
	}

	// Retryable failures are retried with back-off, then converge.
	retry := l.spec(g, "set", id, `{"fakehw":{"files":{"a":"1","b":"2","c":"3"},"fail":{"mode":"retryable","times":2}}}`)
	st = l.waitStatus(g, id, "converged after retries", func(s adminapi.StatusView) bool { return s.ObservedGeneration == retry })
	if s := section(st, "fakehw"); s.State != "CONVERGED" {
		t.Fatalf("after retries: %+v", s)
	}
	// A terminal failure: FAILED, and the generation advances anyway.
	term := l.spec(g, "set", id, `{"fakehw":{"files":{"d":"4"},"fail":{"mode":"terminal"}}}`)
	st = l.waitStatus(g, id, "terminal failure settled", func(s adminapi.StatusView) bool { return s.ObservedGeneration == term })
	if s := section(st, "fakehw"); s.State != "FAILED" || !strings.Contains(s.Message, "injected terminal failure") {
		t.Fatalf("terminal: %+v", s)
	}

	// A pass on demand answers the engine's status.
	code, c := l.runKind(g, id, "agent.converge", "")
	var conv struct {
		Observed uint64 `json:"observed_generation"`
	}
	if err := json.Unmarshal(c.Output, &conv); code != 0 || err != nil || conv.Observed != term {
		t.Errorf("agent.converge: exit %d %v %s", code, err, c.Output)
	}

	// The events reached bcgw, each once.
	var evs []adminapi.EventView
	end := time.Now().Add(10 * time.Second)
	for time.Now().Before(end) {
		evs = nil
		for _, line := range strings.Split(strings.TrimSpace(l.bcgw(g, "events", id, "--json")), "\n") {
			var e adminapi.EventView
			if line != "" && json.Unmarshal([]byte(line), &e) == nil {
				evs = append(evs, e)
			}
		}
		if len(evs) > 0 && evs[len(evs)-1].Type == "section.failed" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	types := map[string]int{}
	seen := map[uint64]bool{}
	for _, e := range evs {
		if seen[e.Seq] {
			t.Errorf("event %d stored twice", e.Seq)
		}
		seen[e.Seq] = true
		types[e.Type]++
	}
	if types["spec.refused"] != 1 || types["section.failed"] != 1 || types["section.converged"] < 1 {
		t.Errorf("events %v", types)
	}
}

// TestDesiredStateOffline: with bcgw stopped and the node killed, the
// node starts again with no gateway and converges toward its stored spec
// (a file removed while it was down comes back; the others are checked,
// not written again), then reports once bcgw is back.
func TestDesiredStateOffline(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	files := filepath.Join(data, fakekinds.SectionDir)
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	gen := l.spec(g, "set", id, `{"fakehw":{"files":{"a":"1","b":"2"}}}`)
	l.waitStatus(g, id, "observed", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })

	node.signal(syscall.SIGKILL)
	node.wait(t, 10*time.Second)
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	if err := os.Remove(filepath.Join(files, "b")); err != nil {
		t.Fatal(err)
	}
	before := sectionLog(t, data)

	l.start("bcd-node", "node", "--config", cfg)
	end := time.Now().Add(30 * time.Second)
	for readFile(t, filepath.Join(files, "b")) != "2" && time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := readFile(t, filepath.Join(files, "b")); got != "2" {
		t.Fatalf("with no gateway the stored spec was not enforced: b = %q", got)
	}
	after := sectionLog(t, data)
	if after["write b"] != before["write b"]+1 || after["write a"] != before["write a"] {
		t.Errorf("side effects before %v after %v: want b written once more, a not at all", before, after)
	}
	if st := l.bcdStatus(cfg); st.Converge.Applied != gen || st.Converge.Observed != gen {
		t.Errorf("bcd status offline: %+v", st.Converge)
	}

	g = l.startGateway(gwDir, g.addr)
	since := time.Now()
	l.waitStatus(g, id, "a report after bcgw is back", func(s adminapi.StatusView) bool {
		return s.Connected && s.ObservedGeneration == gen && s.ReportAt != nil && s.ReportAt.After(since)
	})
}

// TestXidCondition: an Xid line written to the fake kmsg shows as a
// device condition in bcgw status within seconds and survives a restart
// of bcd node in the same (fake) boot; a gpu.reset clears it.
func TestXidCondition(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	// The fake machine's GPU 3 sits at PCI 0000:5d:00.0 (fakehw).
	kmsg := filepath.Join(data, "fakehw", "kmsg")
	line := "3,1234,5678901,-;NVRM: Xid (PCI:0000:5d:00): 79, pid=1234, name=x, GPU has fallen off the bus.\n"
	if err := os.WriteFile(kmsg, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	hasXid := func(s adminapi.StatusView) bool {
		for _, c := range s.Conditions {
			if c.Type == "Xid" && strings.HasPrefix(c.Subject, "GPU-") && strings.Contains(c.Reason, "79") {
				return true
			}
		}
		return false
	}
	begin := time.Now()
	st := l.waitStatus(g, id, "an Xid condition", hasXid)
	t.Logf("Xid condition in bcgw status %s after the kmsg line", time.Since(begin).Round(100*time.Millisecond))
	var gpu string
	for _, c := range st.Conditions {
		if c.Type == "Xid" {
			gpu = c.Subject
		}
	}

	node.signal(syscall.SIGTERM)
	node.wait(t, 15*time.Second)
	restarted := time.Now()
	l.start("bcd-node", "node", "--config", cfg)
	l.waitStatus(g, id, "the Xid condition after a restart", func(s adminapi.StatusView) bool {
		return s.Connected && s.ReportAt != nil && s.ReportAt.After(restarted) && hasXid(s)
	})

	// A reset that leaves the GPU healthy clears it.
	if code, c := l.runKind(g, id, "gpu.reset", `{"gpu":"`+gpu+`"}`); code != 0 || c.Status != "SUCCEEDED" {
		t.Fatalf("gpu.reset: exit %d %+v", code, c)
	}
	l.waitStatus(g, id, "no Xid condition after the reset", func(s adminapi.StatusView) bool { return !hasXid(s) })
}
