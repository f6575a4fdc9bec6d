package bcx

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestMain makes this test binary the shim as well: the host re-executes
// /proc/self/exe __bcx-exec as bcd does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimName {
		os.Exit(Shim(os.Args[2:], os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "__bcx-filtertest" {
		os.Exit(filterChild())
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// testPlugins builds the test plugin twice, flavors a and b (different
// bytes, different hashes).
func testPlugins(t *testing.T) (a, b string) {
	t.Helper()
	if !sandboxSupported {
		testenv.NotApplicable(t, "bcx plugins run only on Linux")
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "bcx-testplugin-")
		if buildErr != nil {
			return
		}
		for _, f := range []string{"a", "b"} {
			cmd := exec.Command("go", "build", "-ldflags", "-X main.flavor="+f, "-o", filepath.Join(buildDir, f), "./testdata/testplugin")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build testplugin: %v\n%s", err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "a"), filepath.Join(buildDir, "b")
}

func sum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	// Write a new file and rename it over: a running plugin's bytes are in
	// its memfd anyway.
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

// logs collects the host's JSON log lines.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(b []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(b) }

func (l *logs) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

// records returns the log records whose msg is msg.
func (l *logs) records(msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(l.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

type env struct {
	h     *Host
	dir   string
	marks string
	logs  *logs
	stop  func()
}

// start runs a host over a plugins directory holding file as bcx-test,
// pinned to pin.
func start(t *testing.T, file, pin string, c Config) *env {
	t.Helper()
	dir := t.TempDir()
	copyFile(t, file, filepath.Join(dir, "bcx-test"))
	if err := os.WriteFile(filepath.Join(dir, PinsFile), []byte("# test\n"+pin+"  bcx-test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Marks are written by the plugin, which may run as another uid.
	marks, err := os.MkdirTemp("", "bcx-marks-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(marks, 0o777)
	t.Cleanup(func() { os.RemoveAll(marks) })
	l := &logs{}
	c.Dir = dir
	c.Log = slog.New(slog.NewJSONHandler(l, nil))
	c.Env = append(c.Env, "BCX_TEST_MARKS="+marks, "HOME=/should-not-leak")
	h, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Run(ctx) }()
	e := &env{h: h, dir: dir, marks: marks, logs: l, stop: func() { cancel(); <-done }}
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			t.Logf("host log:\n%s", l.String())
		}
	})
	return e
}

func (e *env) marked(prefix string) []string {
	ents, _ := os.ReadDir(e.marks)
	var out []string
	for _, d := range ents {
		if strings.HasPrefix(d.Name(), prefix) {
			out = append(out, d.Name())
		}
	}
	return out
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < d {
		if cond() {
			return time.Since(start)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, d)
	return 0
}

func invoke(e *env, op string, body string) (map[string]any, error) {
	out, err := e.h.Invoke(context.Background(), "test", op, []byte(`{"address":"10.0.0.1"}`), []byte(body), map[string][]byte{"password": []byte("hunter2")})
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, err
	}
	return m, nil
}

func TestInvokeAndDescribe(t *testing.T) {
	a, _ := testPlugins(t)
	e := start(t, a, sum(t, a), Config{})
	e.h.WaitStarted(30 * time.Second)
	if d := e.h.Drivers(); len(d) != 1 || d[0].GetId() != "test" || d[0].GetKind() != "test" || d[0].GetVersion() != "a" {
		t.Fatalf("drivers %v", d)
	}
	m, err := invoke(e, "test.echo", `{"x":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(m["body"]) != "map[x:1]" || m["secret_len"] != float64(7) {
		t.Fatalf("echo %v", m)
	}
	// A driver's own error keeps its code and retryable flag; its control
	// characters are dropped.
	_, err = invoke(e, "test.fail", `{}`)
	if CodeOf(err) != "boom" || !IsRetryable(err) || strings.ContainsRune(err.Error(), 1) {
		t.Fatalf("test.fail: %v", err)
	}
	for _, c := range []struct{ driver, op, code string }{
		{"test", "test.nothing", CodeUnsupportedOperation},
		{"ipmi", "power.getPower", CodeUnsupportedDriver},
	} {
		_, err := e.h.Invoke(context.Background(), c.driver, c.op, nil, nil, nil)
		if CodeOf(err) != c.code || IsRetryable(err) {
			t.Errorf("%s %s: %v, want %s", c.driver, c.op, err, c.code)
		}
	}
	if strings.Contains(e.logs.String(), "hunter2") {
		t.Fatal("a secret reached the host's log")
	}
}

// TestSandbox: the plugin runs from the sealed memfd the host hashed, in
// its own process group, with no_new_privs and the seccomp filter, without
// bcd's environment and, when the test runs as root, as the first uid of
// the block.
func TestSandbox(t *testing.T) {
	a, _ := testPlugins(t)
	e := start(t, a, sum(t, a), Config{})
	e.h.WaitStarted(30 * time.Second)
	m, err := invoke(e, "test.probe", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: %v", m)
	if m["pid"] != m["pgid"] {
		t.Errorf("the plugin is not its own process group leader: %v", m)
	}
	if m["no_new_privs"] != "1" || m["seccomp"] != "2" {
		t.Errorf("no_new_privs %v, seccomp %v; want 1 and 2 (filter)", m["no_new_privs"], m["seccomp"])
	}
	if !strings.HasPrefix(fmt.Sprint(m["exe"]), "/memfd:bcx:bcx-test") {
		t.Errorf("the plugin runs from %v, not the hashed memfd", m["exe"])
	}
	for _, k := range []string{"mount", "unshare", "ptrace", "bpf"} {
		if m[k] != "operation not permitted" {
			t.Errorf("%s: %v, want EPERM", k, m[k])
		}
	}
	if m["clone3"] != "function not implemented" {
		t.Errorf("clone3: %v, want ENOSYS", m["clone3"])
	}
	if m["home"] != "/should-not-leak" || m["path"] != pluginPath {
		// HOME here came from Config.Env; the test's own environment must not.
		t.Errorf("environment: HOME %v PATH %v", m["home"], m["path"])
	}
	if os.Geteuid() == 0 {
		if m["uid"] != float64(DefaultUIDBase) || m["gid"] != float64(DefaultUIDBase) || m["groups"] != "" {
			t.Errorf("as root the plugin must run as %d:%d with no groups: %v", DefaultUIDBase, DefaultUIDBase, m)
		}
	} else {
		t.Logf("NOT ROOT: the uid block is not exercised (the plugin runs as uid %v)", m["uid"])
	}
}

// TestPinMismatchNeverStarts: a binary that does not hash to its pin is
// never executed, and its driver answers a retryable unavailable.
func TestPinMismatchNeverStarts(t *testing.T) {
	a, b := testPlugins(t)
	e := start(t, b, sum(t, a), Config{BackoffBase: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	e.h.WaitStarted(30 * time.Second)
	waitUntil(t, "three refused starts", 10*time.Second, func() bool {
		return len(e.logs.records("plugin not started: its binary does not match its pin")) >= 3
	})
	if got := e.marked("started"); len(got) != 0 {
		t.Fatalf("a mispinned plugin ran: %v", got)
	}
	if !strings.Contains(e.logs.String(), sum(t, b)) {
		t.Errorf("the log does not name the hash the binary has")
	}
	_, err := invoke(e, "test.echo", `{}`)
	if CodeOf(err) != CodeUnavailable || !IsRetryable(err) || !strings.Contains(err.Error(), "does not match its pin") {
		t.Fatalf("invoke on a mispinned driver: %v", err)
	}
	if len(e.h.Drivers()) != 0 {
		t.Fatalf("a never-started driver is advertised: %v", e.h.Drivers())
	}
}

// TestKilledMidOperation: a plugin killed while an operation runs is
// restarted after 1 s; the operation and every call meanwhile answer a
// retryable unavailable; each restart hashes the file again.
func TestKilledMidOperation(t *testing.T) {
	a, b := testPlugins(t)
	e := start(t, a, sum(t, a), Config{})
	e.h.WaitStarted(30 * time.Second)
	pid := e.h.PID("test")
	if pid == 0 {
		t.Fatal("not running")
	}
	errc := make(chan error, 1)
	go func() { _, err := invoke(e, "test.sleep", `{}`); errc <- err }()
	waitUntil(t, "the operation running", 10*time.Second, func() bool { return len(e.marked("sleeping")) == 1 })
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if CodeOf(err) != CodeUnavailable || !IsRetryable(err) {
		t.Fatalf("the interrupted operation: %v, want a retryable unavailable", err)
	}
	waitUntil(t, "the host seeing the exit", 5*time.Second, func() bool { return e.h.PID("test") == 0 })
	if _, err := invoke(e, "test.echo", `{}`); CodeOf(err) != CodeUnavailable || !IsRetryable(err) {
		t.Fatalf("while down: %v, want a retryable unavailable", err)
	}
	waitUntil(t, "the restart", 10*time.Second, func() bool { p := e.h.PID("test"); return p != 0 && p != pid })
	back := time.Since(killed)
	t.Logf("killed mid-operation: back after %v (back-off 1 s)", back.Round(time.Millisecond))
	if back < 900*time.Millisecond {
		t.Fatalf("restarted after %v, before the 1 s back-off", back)
	}
	if m, err := invoke(e, "test.echo", `{}`); err != nil || m["flavor"] != "a" {
		t.Fatalf("after the restart: %v %v", m, err)
	}
	// The file is swapped for other bytes: the next start hashes it again
	// and refuses it; the old bytes come back, so does the plugin.
	copyFile(t, b, filepath.Join(e.dir, "bcx-test"))
	pid = e.h.PID("test")
	syscall.Kill(pid, syscall.SIGKILL)
	waitUntil(t, "the swapped file refused", 10*time.Second, func() bool {
		return len(e.logs.records("plugin not started: its binary does not match its pin")) >= 1
	})
	if _, err := invoke(e, "test.echo", `{}`); CodeOf(err) != CodeUnavailable || !strings.Contains(err.Error(), "does not match its pin") {
		t.Fatalf("with a swapped file: %v", err)
	}
	if got := e.marked("started-b"); len(got) != 0 {
		t.Fatalf("the swapped binary ran: %v", got)
	}
	copyFile(t, a, filepath.Join(e.dir, "bcx-test"))
	waitUntil(t, "the restart with the pinned bytes", 15*time.Second, func() bool { return e.h.PID("test") != 0 })
}

// TestBackoff: a plugin that exits at once is started again after base,
// 2 base, 4 base, ... up to max.
func TestBackoff(t *testing.T) {
	a, _ := testPlugins(t)
	base, max := 200*time.Millisecond, 800*time.Millisecond
	e := start(t, a, sum(t, a), Config{BackoffBase: base, BackoffMax: max, Env: []string{"BCX_TEST_EXIT_AT_START=1"}})
	waitUntil(t, "six attempts", 20*time.Second, func() bool { return len(e.logs.records("plugin exited; restarting it")) >= 6 })
	recs := e.logs.records("plugin exited; restarting it")
	want := []time.Duration{200, 400, 800, 800, 800}
	var got []string
	for i := 1; i < 6; i++ {
		t0, _ := time.Parse(time.RFC3339Nano, recs[i-1]["time"].(string))
		t1, _ := time.Parse(time.RFC3339Nano, recs[i]["time"].(string))
		gap := t1.Sub(t0)
		got = append(got, gap.Round(time.Millisecond).String())
		w := want[i-1] * time.Millisecond
		if gap < w || gap > w+time.Second {
			t.Errorf("gap %d: %v, want %v (plus a start)", i, gap, w)
		}
		if recs[i-1]["retry_in"] != w.String() {
			t.Errorf("record %d says retry_in %v, want %v", i-1, recs[i-1]["retry_in"], w)
		}
	}
	t.Logf("gaps between starts of a plugin that exits at once: %s", strings.Join(got, ", "))
	if n := len(e.marked("started")); n < 6 {
		t.Fatalf("the plugin ran %d times", n)
	}
	if _, err := invoke(e, "test.echo", `{}`); CodeOf(err) != CodeUnavailable || !IsRetryable(err) {
		t.Fatalf("while crash-looping: %v", err)
	}
}

func TestDelay(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{0, time.Second}, {1, 2 * time.Second}, {2, 4 * time.Second}, {5, 32 * time.Second}, {6, time.Minute}, {7, time.Minute}, {100, time.Minute}} {
		if got := Delay(c.n, DefaultBackoffBase, DefaultBackoffMax); got != c.want {
			t.Errorf("Delay(%d) = %v, want %v", c.n, got, c.want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, pins string
		cfg        Config
		want       string
	}{
		{"relative dir", "", Config{Dir: "plugins"}, "absolute"},
		{"no pins file", "-", Config{}, "pins file"},
		{"bad pins", "zz  bcx-x\n", Config{}, "64 hex"},
		{"uid base too high", "", Config{UIDBase: 1<<32 - 2}, "uid_base"},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.Remove(filepath.Join(dir, PinsFile))
			if c.pins != "-" {
				os.WriteFile(filepath.Join(dir, PinsFile), []byte(c.pins), 0o644)
			}
			if c.cfg.Dir == "" {
				c.cfg.Dir = dir
			}
			if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want %q", err, c.want)
			}
		})
	}
}
