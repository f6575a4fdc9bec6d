package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// simConfig writes a config.toml and join-encryption.jwk for bcd sim from
// the gateway's well-known document.
func (l *lab) simConfig(g *gw, name string) string {
	l.t.Helper()
	var doc struct {
		Gateway struct{ URL, ServerName string }
		Pins    struct{ ServingCa, JoinSigning, JoinEncryption string }
		Join    struct {
			EncryptionJwk json.RawMessage `json:"encryptionJwk"`
		}
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "well-known")), &doc); err != nil {
		l.t.Fatal(err)
	}
	dir := filepath.Join(l.root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		l.t.Fatal(err)
	}
	cfg := fmt.Sprintf("gateway = %q\ngateway_server_name = %q\nserving_ca_spki_pin = %q\njoin_signing_key_pin = %q\njoin_encryption_key_pin = %q\ndata_dir = %q\n\n[log]\nlevel = \"warn\"\n",
		doc.Gateway.URL, doc.Gateway.ServerName, doc.Pins.ServingCa, doc.Pins.JoinSigning, doc.Pins.JoinEncryption, filepath.Join(dir, "data"))
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "join-encryption.jwk"), doc.Join.EncryptionJwk, 0o644); err != nil {
		l.t.Fatal(err)
	}
	return p
}

// TestSim: bcd sim --nodes 200 joins 200 distinct machines to one bcgw
// with one token read once from stdin; a node.reboot restarts only that
// machine's agent (a new boot id, SUCCEEDED); SIGTERM prints the summary;
// the token appears in no output.
func TestSim(t *testing.T) {
	const n = 200
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", fmt.Sprint(n))
	cfg := l.simConfig(g, "sim")

	p := l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "100")
	end := time.Now().Add(3 * time.Minute)
	var nodes []nodeView
	for time.Now().Before(end) {
		nodes = l.nodes(g)
		c := 0
		for _, x := range nodes {
			if x.Connected {
				c++
			}
		}
		if c == n {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if len(nodes) != n {
		t.Fatalf("%d nodes joined, want %d", len(nodes), n)
	}
	ids := map[string]bool{}
	for _, x := range nodes {
		if !x.Connected {
			t.Fatalf("node %s not connected", x.ID)
		}
		ids[x.ID] = true
	}
	if len(ids) != n {
		t.Fatalf("%d distinct nodes, want %d", len(ids), n)
	}

	// node.reboot on one machine.
	target := nodes[7].ID
	code, out, errOut := l.run("", nil, "bcgw", "run", target, "node.reboot", "--wait", "--timeout", "60s", "--data-dir", g.dataDir)
	if code != 0 || !strings.Contains(out, "boot_id_after") {
		t.Fatalf("node.reboot: exit %d: %s %s", code, out, errOut)
	}
	var r struct {
		Output struct{ BootIDBefore, BootIDAfter string } `json:"output"`
	}
	_ = json.Unmarshal([]byte(strings.ReplaceAll(strings.ReplaceAll(out, "boot_id_before", "BootIDBefore"), "boot_id_after", "BootIDAfter")), &r)
	if r.Output.BootIDBefore == "" || r.Output.BootIDBefore == r.Output.BootIDAfter {
		t.Fatalf("boot ids %+v", r.Output)
	}
	for _, x := range l.nodes(g) {
		if x.ID != target && x.Epoch != 1 {
			t.Errorf("node %s reconnected (epoch %d) though only %s rebooted", x.ID, x.Epoch, target)
		}
		if x.ID == target && x.Epoch < 2 {
			t.Errorf("rebooted node %s has epoch %d", x.ID, x.Epoch)
		}
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("bcd sim after SIGTERM: exit %d", code)
	}
	if !strings.Contains(p.stdout.String(), fmt.Sprintf("bcd sim: %d machines, %d joined this run, 1 reboots", n, n)) {
		t.Fatalf("summary: %q", p.stdout.String())
	}
	l.out.assertAbsent(t, "the join token", tok)
}

// TestNodeRebootReexecs: a fakehw bcd node "reboots" by executing itself
// again with a new boot id; the command ends SUCCEEDED after the reboot.
func TestNodeRebootReexecs(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1")
	cfg, id := l.joinNode(g, "n", tok, "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	pid := node.cmd.Process.Pid
	code, out, _ := l.run("", nil, "bcgw", "run", id, "node.reboot", "--wait", "--timeout", "60s", "--data-dir", g.dataDir)
	if code != 0 || !strings.Contains(out, "boot_id_after") {
		t.Fatalf("node.reboot: exit %d: %s", code, out)
	}
	if node.cmd.Process.Pid != pid || func() bool {
		select {
		case <-node.done:
			return true
		default:
			return false
		}
	}() {
		t.Fatal("the re-exec should keep the process (same pid)")
	}
	// The host build has no fake reboot.
	code, _, errOut := l.run("", nil, "bcd-node-host", "sim")
	if code != 2 || !strings.Contains(errOut, "bcd sim: needs a fakehw build (go build -tags fakehw)") {
		t.Fatalf("host build sim: exit %d %q", code, errOut)
	}
}

// TestSimShards: bcd sim with more machines than --per-process joins
// them all itself, then runs them in child processes of at most that
// many (each its own open-file limit); every machine connects once, with
// its own identity; SIGTERM ends the children and the summary counts a
// reboot in a child.
func TestSimShards(t *testing.T) {
	const n, per = 25, 10
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", fmt.Sprint(n))
	cfg := l.simConfig(g, "sim")
	p := l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--per-process", fmt.Sprint(per))
	var nodes []nodeView
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		nodes = l.nodes(g)
		c := 0
		for _, x := range nodes {
			if x.Connected {
				c++
			}
		}
		if c == n {
			break
		}
	}
	ids := map[string]bool{}
	for _, x := range nodes {
		if !x.Connected || x.Epoch != 1 {
			t.Fatalf("node %s: connected %v, epoch %d", x.ID, x.Connected, x.Epoch)
		}
		ids[x.ID] = true
	}
	if len(ids) != n {
		t.Fatalf("%d distinct nodes connected, want %d", len(ids), n)
	}
	// The shards are children of bcd sim, each with at most per machines.
	var shards []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("\nPPid:\t%d\n", p.cmd.Process.Pid)) {
			continue
		}
		argv, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		shards = append(shards, strings.ReplaceAll(string(argv), "\x00", " "))
	}
	if len(shards) != 3 {
		t.Fatalf("bcd sim has %d child processes, want 3: %q", len(shards), shards)
	}
	for _, s := range shards {
		if !strings.Contains(s, "--shard ") {
			t.Errorf("child %q is not a shard", s)
		}
	}
	code, out, errOut := l.run("", nil, "bcgw", "run", nodes[0].ID, "node.reboot", "--wait", "--timeout", "60s", "--data-dir", g.dataDir)
	if code != 0 || !strings.Contains(out, "boot_id_after") {
		t.Fatalf("node.reboot: exit %d: %s %s", code, out, errOut)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("bcd sim after SIGTERM: exit %d", code)
	}
	if !strings.Contains(p.stdout.String(), fmt.Sprintf("bcd sim: %d machines, %d joined this run, 1 reboots", n, n)) {
		t.Fatalf("summary: %q", p.stdout.String())
	}
	l.out.assertAbsent(t, "the join token", tok)
}
