package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bins are the binaries built once for the package's tests.
var bins struct {
	dir  string
	err  error
	once sync.Once
}

func build(t testing.TB) string {
	t.Helper()
	bins.once.Do(func() {
		bins.dir, bins.err = os.MkdirTemp("", "bcd-e2e-bin")
		if bins.err != nil {
			return
		}
		for _, b := range []struct{ out, pkg, tags string }{
			{"bcgw", "./cmd/bcgw", ""},
			{"bcd-node", "./roles/node", "fakehw"},
			{"bcd-node-host", "./roles/node", ""},
			{"bcd-ramdisk", "./roles/ramdisk", ""},
			{"bcd-site", "./roles/site", "fakehw"},
		} {
			args := []string{"build", "-trimpath", "-o", filepath.Join(bins.dir, b.out)}
			if b.tags != "" {
				args = append(args, "-tags", b.tags)
			}
			cmd := exec.Command("go", append(args, b.pkg)...)
			cmd.Dir = ".."
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				bins.err = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.dir
}

// outputs collects everything every process printed, for the secret check.
type outputs struct {
	mu  sync.Mutex
	all []*syncBuf
}

func (o *outputs) add(b *syncBuf) {
	o.mu.Lock()
	o.all = append(o.all, b)
	o.mu.Unlock()
}

// assertAbsent fails when any output of any process contains secret.
func (o *outputs) assertAbsent(t testing.TB, what, secret string) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.all {
		if !b.shows && strings.Contains(b.String(), secret) {
			t.Errorf("%s appears in the output of %s", what, b.name)
		}
	}
}

type syncBuf struct {
	name string
	// shows marks the one output meant to show a secret (token create).
	shows bool
	mu    sync.Mutex
	b     bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lab is one test's world: a bin dir, a temp root and all outputs.
type lab struct {
	t    testing.TB
	bin  string
	root string
	out  *outputs
	// cred, when set, runs every process of this lab as that user (with
	// / as its working directory).
	cred *syscall.Credential
}

// as sets cmd to run as l.cred, when set.
func (l *lab) as(cmd *exec.Cmd) {
	if l.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.cred}
		cmd.Dir = "/"
	}
}

func newLab(t testing.TB) *lab {
	return &lab{t: t, bin: build(t), root: t.TempDir(), out: &outputs{}}
}

// run runs a command to completion with stdin and env, returning its exit
// code, stdout and stderr.
func (l *lab) run(stdin string, env []string, name string, args ...string) (int, string, string) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(l.bin, name), args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	l.as(cmd)
	so, se := &syncBuf{name: name + " " + strings.Join(args, " ") + " (stdout)"}, &syncBuf{name: name + " (stderr)"}
	l.out.add(so)
	l.out.add(se)
	cmd.Stdout, cmd.Stderr = so, se
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		l.t.Fatalf("%s: %v", name, err)
	}
	return code, so.String(), se.String()
}

// proc is a long-running process.
type proc struct {
	cmd    *exec.Cmd
	stdout *syncBuf
	stderr *syncBuf
	done   chan struct{}
	err    error
}

func (l *lab) start(name string, args ...string) *proc {
	l.t.Helper()
	return l.startEnv(nil, name, args...)
}

// startEnv starts a long-running process with extra environment.
func (l *lab) startEnv(env []string, name string, args ...string) *proc {
	l.t.Helper()
	return l.startStdin("", env, name, args...)
}

// startStdin starts a long-running process with stdin and extra environment.
func (l *lab) startStdin(stdin string, env []string, name string, args ...string) *proc {
	l.t.Helper()
	cmd := exec.Command(filepath.Join(l.bin, name), args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	l.as(cmd)
	se := &syncBuf{name: name + " " + strings.Join(args, " ") + " (stderr)"}
	so := &syncBuf{name: name + " (stdout)"}
	l.out.add(se)
	l.out.add(so)
	cmd.Stdout, cmd.Stderr = so, se
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{cmd: cmd, stderr: se, stdout: so, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	l.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if l.t.Failed() {
			l.t.Logf("%s stderr:\n%s", se.name, se.String())
		}
	})
	return p
}

func (p *proc) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

// wait waits for exit and returns the exit code.
func (p *proc) wait(t testing.TB, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("process did not exit within %s", d)
		return -1
	}
}

// waitLog waits for a JSON log line whose msg is msg and returns it.
func (p *proc) waitLog(t testing.TB, msg string, d time.Duration) map[string]any {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
				return m
			}
		}
		select {
		case <-p.done:
			t.Fatalf("process exited before logging %q:\n%s", msg, p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no %q log line within %s:\n%s", msg, d, p.stderr.String())
	return nil
}

// gateway is a running bcgw.
type gw struct {
	*proc
	dataDir string
	addr    string
}

func (l *lab) startGateway(dataDir, listen string, extra ...string) *gw {
	l.t.Helper()
	p := l.start("bcgw", append([]string{"serve", "--data-dir", dataDir, "--listen", listen}, extra...)...)
	m := p.waitLog(l.t, "bcgw serving", 30*time.Second)
	return &gw{proc: p, dataDir: dataDir, addr: m["addr"].(string)}
}

func (l *lab) bcgw(g *gw, args ...string) string {
	l.t.Helper()
	code, out, errOut := l.run("", nil, "bcgw", append(args, "--data-dir", g.dataDir)...)
	if code != 0 {
		l.t.Fatalf("bcgw %v: exit %d: %s", args, code, errOut)
	}
	return out
}

func (l *lab) token(g *gw, args ...string) string {
	l.t.Helper()
	code, out, errOut := l.run("", nil, "bcgw", append([]string{"token", "create", "--data-dir", g.dataDir}, args...)...)
	if code != 0 {
		l.t.Fatalf("bcgw token create: exit %d: %s", code, errOut)
	}
	l.out.mu.Lock()
	for _, b := range l.out.all {
		if b.String() == out {
			b.shows = true
		}
	}
	l.out.mu.Unlock()
	return strings.TrimSpace(out)
}

type nodeView struct {
	ID        string `json:"id"`
	Role      string `json:"role"`
	Site      string `json:"site"`
	Connected bool   `json:"connected"`
	Epoch     uint64 `json:"epoch"`
	Revoked   bool   `json:"revoked"`
	BootLease bool   `json:"boot_lease"`
	Gateway   string `json:"gateway"`
}

func (l *lab) nodes(g *gw) []nodeView {
	l.t.Helper()
	var ns []nodeView
	if err := json.Unmarshal([]byte(l.bcgw(g, "nodes", "--json")), &ns); err != nil {
		l.t.Fatal(err)
	}
	return ns
}

// waitNode waits until cond holds for the node's view.
func (l *lab) waitNode(g *gw, id string, what string, cond func(nodeView) bool) nodeView {
	l.t.Helper()
	end := time.Now().Add(60 * time.Second)
	for time.Now().Before(end) {
		for _, n := range l.nodes(g) {
			if n.ID == id && cond(n) {
				return n
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	l.t.Fatalf("node %s: %s: not within 60s; nodes: %+v", id, what, l.nodes(g))
	return nodeView{}
}

var socketRe = regexp.MustCompile(`(?m)^socket_path = .*$`)

var joinedRe = regexp.MustCompile(`^joined as (node_[a-z0-9]+) \(site (\S+), role (\S+)\); certificate valid until \S+\n$`)

// joinNode joins a node with the token on stdin against g and returns its
// config path and node id.
func (l *lab) joinNode(g *gw, name, tok, role string) (string, string) {
	l.t.Helper()
	dir := filepath.Join(l.root, name)
	cfg := filepath.Join(dir, "config.toml")
	pins := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	bin := "bcd-node"
	if role == "site" {
		bin = "bcd-site"
	}
	args := append([]string{"join", "--config", cfg, "--server", "https://" + g.addr, "--data-dir", filepath.Join(dir, "data"), "--role", role}, pins...)
	code, out, errOut := l.run(tok+"\n", nil, bin, args...)
	if code != 0 {
		l.t.Fatalf("bcd join: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	m := joinedRe.FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("bcd join printed %q", out)
	}
	if m[3] != role {
		l.t.Fatalf("joined with role %s, want %s", m[3], role)
	}
	// Each test agent gets its own status socket.
	b, err := os.ReadFile(cfg)
	if err != nil {
		l.t.Fatal(err)
	}
	b = socketRe.ReplaceAll(b, []byte(fmt.Sprintf("socket_path = %q", filepath.Join(dir, "run", "bcd.sock"))))
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		l.t.Fatal(err)
	}
	return cfg, m[1]
}
