package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
)

// runCLI runs bcgw with args and stdin; it returns the exit code, stdout
// and stderr.
func runCLI(t *testing.T, ctx context.Context, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &cli.Env{Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &errOut,
		Getenv: func(string) string { return "" }, Unsetenv: func(string) error { return nil }}
	code := program().Main(ctx, env, args)
	return code, out.String(), errOut.String()
}

func TestSpecStatusEventsArgumentErrors(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nobcgw")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"spec without a verb", []string{"spec"}, "usage: bcgw spec set"},
		{"spec with an unknown verb", []string{"spec", "frob", "node_x"}, "usage: bcgw spec set"},
		{"spec set without a node", []string{"spec", "set", "--file", "-"}, "usage: bcgw spec set NODE --file F"},
		{"spec set with two nodes", []string{"spec", "set", "a", "b", "--file", "-"}, "usage: bcgw spec set NODE"},
		{"spec set without --file", []string{"spec", "set", "node_x", "--data-dir", dir}, "--file is required"},
		{"spec patch without --file", []string{"spec", "patch", "node_x", "--data-dir", dir}, "--file is required"},
		{"spec get with --file", []string{"spec", "get", "node_x", "--file", "f"}, "usage: bcgw spec get NODE"},
		{"status without a node", []string{"status"}, "usage: bcgw status NODE [--json]"},
		{"status with an unknown flag", []string{"status", "node_x", "--jsn"}, "usage: bcgw status NODE"},
		{"events without a node", []string{"events", "--follow"}, "usage: bcgw events NODE [--follow] [--json]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, context.Background(), "", tt.args...)
			if code != cli.ExitUsage || !strings.Contains(errOut, tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut, cli.ExitUsage, tt.want)
			}
		})
	}
	// A file that cannot be read, or is empty, fails before any call.
	code, _, errOut := runCLI(t, context.Background(), "", "spec", "set", "node_x", "--file", filepath.Join(dir, "absent.json"), "--data-dir", dir)
	if code != cli.ExitFailure || !strings.Contains(errOut, "--file") {
		t.Errorf("absent file: exit %d %q", code, errOut)
	}
	code, _, errOut = runCLI(t, context.Background(), "  \n", "spec", "set", "node_x", "--file", "-", "--data-dir", dir)
	if code != cli.ExitFailure || !strings.Contains(errOut, "stdin is empty") {
		t.Errorf("empty stdin: exit %d %q", code, errOut)
	}
	// No gateway on that data directory.
	code, _, errOut = runCLI(t, context.Background(), "", "spec", "get", "node_x", "--data-dir", dir)
	if code != cli.ExitFailure || !strings.Contains(errOut, "is bcgw serve running") {
		t.Errorf("no gateway: exit %d %q", code, errOut)
	}
}

// startServer runs a gateway in-process with one node and one site agent
// in its store, until the test ends.
func startServer(t *testing.T) (*gateway.Server, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := gateway.New(gateway.Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []store.Node{{ID: "node_a", Role: "node", Site: "lab"}, {ID: "node_s", Role: "site", Site: "lab"}} {
		if err := s.Store().PutNode(n); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	ac := adminapi.NewClient(dir, "", "")
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := ac.Nodes(context.Background()); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the admin API did not answer within 5s")
		}
	}
	return s, dir
}

func TestSpecStatusEventsCommands(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, stdin, append(args, "--data-dir", dir)...)
	}
	file := filepath.Join(t.TempDir(), "spec.json")
	if err := os.WriteFile(file, []byte(`{"host":{"hostname":"h1"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run("", "spec", "set", "node_a", "--file", file); code != 0 || out != "1\n" {
		t.Fatalf("spec set: exit %d %q %q", code, out, errOut)
	}
	if code, out, errOut := run(`{"telemetry":{"every":5}}`, "spec", "patch", "--file", "-", "node_a", "--json"); code != 0 || !strings.Contains(out, `"generation": 2`) {
		t.Fatalf("spec patch --json: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut := run("", "spec", "get", "node_a")
	var got struct {
		Generation uint64
		Spec       map[string]json.RawMessage
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Generation != 2 || len(got.Spec) != 2 {
		t.Fatalf("spec get: exit %d %q %q", code, out, errOut)
	}
	// Refusals name what is wrong and change nothing.
	for _, tt := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"spec", "set", "node_a", "--file", "-"}, `{"gpus":{}}`, `unknown section "gpus"`},
		{[]string{"spec", "patch", "node_a", "--file", "-"}, `[]`, "not a JSON object"},
		{[]string{"spec", "set", "node_nosuch", "--file", "-"}, `{}`, "bcgw nodes"},
		{[]string{"spec", "patch", "node_s", "--file", "-"}, `{"site":{"boot_lease":{"held":true}}}`, "gateway alone"},
		{[]string{"spec", "get", "node_nosuch"}, ``, "not found"},
		{[]string{"status", "node_nosuch"}, ``, "not found"},
		{[]string{"events", "node_nosuch"}, ``, "not found"},
	} {
		if code, _, errOut := run(tt.stdin, tt.args...); code != cli.ExitFailure || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want 1 and %q", tt.args, code, errOut, tt.want)
		}
	}
	if gen, _, _ := s.Spec("node_a"); gen != 2 {
		t.Errorf("generation %d after refusals, want 2", gen)
	}

	// status: text by default, the view with --json.
	code, out, errOut = run("", "status", "node_a")
	if code != 0 || !strings.Contains(out, "not connected") || !strings.Contains(out, "generation 2; the agent holds 0") || !strings.Contains(out, "none yet") {
		t.Fatalf("status: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = run("", "status", "node_a", "--json")
	var v adminapi.StatusView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Node != "node_a" || v.SpecGeneration != 2 || v.Connected {
		t.Fatalf("status --json: exit %d %q %q", code, out, errOut)
	}

	// events: none, then what the store holds, oldest first.
	if code, out, _ := run("", "events", "node_a", "--json"); code != 0 || out != "" {
		t.Fatalf("events of a node without any: %d %q", code, out)
	}
	for _, e := range []store.Event{
		{Seq: 2, Type: "xid", Body: []byte(`{"xid":79}`), AtUnixMS: 1_800_000_000_000},
		{Seq: 1, Type: "boot", Body: []byte(`hello`), AtUnixMS: 1_799_999_999_000},
	} {
		if _, err := s.Store().AddEvent("node_a", e, fleet.MaxEvents); err != nil {
			t.Fatal(err)
		}
	}
	code, out, _ = run("", "events", "node_a")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "SEQ") || !strings.HasPrefix(lines[1], "1 ") ||
		!strings.Contains(lines[1], `"hello"`) || !strings.Contains(lines[2], `{"xid":79}`) {
		t.Fatalf("events: exit %d\n%s", code, out)
	}
	code, out, _ = run("", "events", "node_a", "--json")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	var e adminapi.EventView
	if code != 0 || len(lines) != 2 || json.Unmarshal([]byte(lines[1]), &e) != nil || e.Seq != 2 || e.Type != "xid" {
		t.Fatalf("events --json: exit %d\n%s", code, out)
	}

	// --follow prints what comes later, until interrupted.
	fctx, stop := context.WithCancel(ctx)
	var fout, ferr lockedBuffer
	env := &cli.Env{Stdin: strings.NewReader(""), Stdout: &fout, Stderr: &ferr,
		Getenv: func(string) string { return "" }, Unsetenv: func(string) error { return nil }}
	done := make(chan int, 1)
	go func() {
		done <- program().Main(fctx, env, []string{"events", "node_a", "--follow", "--json", "--data-dir", dir})
	}()
	if _, err := s.Store().AddEvent("node_a", store.Event{Seq: 3, Type: "later"}, fleet.MaxEvents); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); !strings.Contains(fout.String(), `"later"`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("--follow did not print the later event: %q %q", fout.String(), ferr.String())
		}
	}
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("--follow ended with %d: %s", code, ferr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("--follow did not stop on interrupt")
	}
	if n := strings.Count(fout.String(), `"seq"`); n != 3 {
		t.Errorf("--follow printed %d events, want each of the 3 once:\n%s", n, fout.String())
	}
}

// lockedBuffer is a buffer written by one goroutine and read by another.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRunDeadlineCap: bcgw run and bcgw upgrade refuse a deadline beyond
// intent.MaxDeadline before they reach any gateway, and run --submit a
// prepared command due later, saying why.
func TestRunDeadlineCap(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nobcgw")
	for _, args := range [][]string{
		{"run", "node_x", "agent.ping", "--deadline", "8760h", "--data-dir", dir},
		{"run", "node_x", "agent.ping", "--prepare", "--deadline", "169h", "--data-dir", dir},
		{"upgrade", "node_x", "--version", "0.2.0", "--timeout", "8760h", "--data-dir", dir},
	} {
		code, _, errOut := runCLI(t, context.Background(), "", args...)
		if code != cli.ExitUsage || !strings.Contains(errOut, "is more than 168h0m0s ahead: agents refuse a signed command due later") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	file := filepath.Join(t.TempDir(), "cmd.json")
	b, _ := json.Marshal(adminapi.PreparedCommand{ID: "cmd_aaaaaaaaaaaaaaaaaaaaa", NodeID: "node_x", Kind: "agent.ping",
		DeadlineMS: time.Now().Add(8760 * time.Hour).UnixMilli()})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, context.Background(), "", "run", "--submit", file, "--data-dir", dir)
	if code != cli.ExitFailure || !strings.Contains(errOut, "ahead: agents refuse a signed command due later") {
		t.Errorf("submit a year out: exit %d, stderr %q", code, errOut)
	}
	// Within the cap, the same commands go on to the gateway (none here).
	code, _, errOut = runCLI(t, context.Background(), "", "run", "node_x", "agent.ping", "--deadline", "168h", "--data-dir", dir)
	if code != cli.ExitFailure || !strings.Contains(errOut, "is bcgw serve running") {
		t.Errorf("a week: exit %d, stderr %q", code, errOut)
	}
}
