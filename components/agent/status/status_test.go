package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
)

// shortDir returns a private temporary directory with a short path: a unix
// socket path must stay under 108 bytes, which t.TempDir's long names can
// pass.
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "bst")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func sample() Snapshot {
	at := time.Date(2026, 9, 26, 8, 0, 0, 0, time.UTC)
	return Snapshot{
		NodeID: "node_01k5w", Site: "fsn1", Role: "node", BootID: "3f1c2d4e", Version: "0.1.0",
		Gateway: "https://gw.eu-1.example.com", Connected: true, Epoch: 7, SessionSince: at,
		ClockOffsetMS: -12, TimeMark: at.Add(12 * time.Minute),
		Running:      []Job{{ID: "cmd_01", Kind: "agent.ping", Lane: "control", Started: at.Add(time.Minute)}},
		Deferred:     []Job{{ID: "cmd_02", Kind: "gpu.hold", Lane: "provision", Started: at.Add(2 * time.Minute)}},
		Lanes:        []Lane{{Lane: "control", Size: 4, Free: 3}, {Lane: "provision", Size: 2, Free: 2}},
		EventBacklog: 3, EventsDropped: 1, ResultsUnacked: 2,
		CertificateNotAfter: at.Add(14*time.Hour + 12*time.Minute), CertificateValidFor: "14h12m0s",
		KeyHolder:    KeyInFile,
		SignedIntent: SignedIntent{TrustBundleVersion: 2, Enforced: true, Roots: 1},
		Converge: Converge{Applied: 4, Observed: 3, Sections: []Section{
			{Name: "fakehw", State: "CONVERGED", Generation: 4, Since: at.Add(10 * time.Minute)},
			{Name: "site", State: "RETRYING", Generation: 4, Since: at.Add(11 * time.Minute), Attempts: 2,
				Message: "apply: pull failed", Changes: []string{"keep 1 cache images"}},
		}},
		GPUs: []GPU{{Index: 0, UUID: "GPU-5f1c", Name: "NVIDIA H100 80GB HBM3", UtilizationPct: 87, TemperatureC: 61,
			PowerW: 540, PowerLimitW: 700, MemoryUsedMiB: 72909, MemoryTotalMiB: 81559}},
	}
}

// start serves snap on a socket in a fresh directory and returns its path;
// the server stops when the test ends.
func start(t *testing.T, path string, snap func() Snapshot, timeout time.Duration) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, path, snap, nil, timeout) }()
	waitFor(t, path)
	var stopped bool
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("Serve did not return after its context ended")
		}
	}
	t.Cleanup(func() { stop() })
	return stop
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	for range 200 {
		if fi, err := os.Lstat(path); err == nil && fi.Mode().Perm() == 0o600 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no socket at %s", path)
}

func TestServeAndRead(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "run", "bcd.sock") // run/ does not exist yet
	want := sample()
	stop := start(t, path, func() Snapshot { return want }, ConnTimeout)

	got, err := Read(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}

	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want a socket with 0600", fi.Mode())
	}
	di, err := os.Stat(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if di.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %04o, want 0700", di.Mode().Perm())
	}

	if err := stop(); err != nil {
		t.Fatalf("Serve returned %v after its context ended", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket still there after Serve returned: %v", err)
	}
}

func TestEmptyListsAreArrays(t *testing.T) {
	path := filepath.Join(shortDir(t), "bcd.sock")
	start(t, path, func() Snapshot { return Snapshot{NodeID: "n"} }, ConnTimeout)
	line := exchange(t, path, "status\n")
	for _, key := range []string{`"running":[]`, `"deferred":[]`, `"lanes":[]`, `"gpus":[]`} {
		if !strings.Contains(line, key) {
			t.Errorf("answer lacks %s: %s", key, line)
		}
	}
	if strings.Contains(line, "session_since") || strings.Contains(line, "0001-01-01") {
		t.Errorf("zero times are sent: %s", line)
	}
	if !strings.HasSuffix(line, "}\n") || strings.Count(line, "\n") != 1 {
		t.Errorf("answer is not one JSON line: %q", line)
	}
}

// exchange sends req on a raw connection and returns everything the server
// wrote before it closed the connection.
func exchange(t *testing.T, path, req string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	if uc, ok := c.(*net.UnixConn); ok {
		uc.CloseWrite()
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestRequests(t *testing.T) {
	path := filepath.Join(shortDir(t), "bcd.sock")
	start(t, path, sample, ConnTimeout)
	tests := []struct {
		name, req string
		want      string // substring of the answer; "" means no answer at all
	}{
		{"status", "status\n", `"node_id":"node_01k5w"`},
		{"crlf", "status\r\n", `"node_id":"node_01k5w"`},
		{"no newline, then close", "status", `"node_id":"node_01k5w"`},
		{"unknown", "SECRET-TOKEN\n", `"error":"unknown request; send \"status\""`},
		{"empty", "", ""},
		{"too long", strings.Repeat("s", MaxRequest+10) + "\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := exchange(t, path, tt.req)
			if tt.want == "" {
				if got != "" {
					t.Errorf("answered %q", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("answer %q lacks %q", got, tt.want)
			}
			if strings.Contains(got, "SECRET") {
				t.Errorf("answer echoes the request: %q", got)
			}
		})
	}
}

func TestReadRefused(t *testing.T) {
	// A raw server that answers with an error, as to an unknown request.
	errPath := filepath.Join(shortDir(t), "e.sock")
	l, err := net.Listen("unix", errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		readRequest(c)
		io.WriteString(c, `{"error":"nope"}`+"\n")
	}()
	if _, err := Read(context.Background(), errPath); err == nil || !strings.Contains(err.Error(), "refused the request: nope") {
		t.Errorf("error %v", err)
	}
}

func TestReadErrors(t *testing.T) {
	dir := shortDir(t)
	missing := filepath.Join(dir, "missing.sock")
	_, err := Read(context.Background(), missing)
	if err == nil {
		t.Fatal("no error for a missing socket")
	}
	for _, s := range []string{"is bcd node running?", "socket_path = " + missing} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q lacks %q", err, s)
		}
	}

	// A stale socket: nothing listens.
	stale := staleSocket(t, dir, "stale.sock")
	if _, err := Read(context.Background(), stale); err == nil || !strings.Contains(err.Error(), "is bcd node running?") {
		t.Errorf("stale socket: %v", err)
	}

	// A server that accepts but never answers.
	mute := filepath.Join(dir, "mute.sock")
	l, err := net.Listen("unix", mute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	begin := time.Now()
	if _, err := Read(ctx, mute); err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("mute server: %v", err)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("Read took %s past its context", d)
	}
}

// staleSocket leaves a socket file at dir/name that nothing listens on.
func staleSocket(t *testing.T, dir, name string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := os.Lstat(p); err != nil {
		t.Fatalf("stale socket not left: %v", err)
	}
	return p
}

func TestStaleSocketReplaced(t *testing.T) {
	dir := shortDir(t)
	path := staleSocket(t, dir, "bcd.sock")
	os.Chmod(path, 0o666)
	start(t, path, sample, ConnTimeout)
	if _, err := Read(context.Background(), path); err != nil {
		t.Fatalf("after replacing a stale socket: %v", err)
	}
}

func TestServeRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) string // returns the socket path
		want  []string
	}{
		{
			name: "open directory it did not create",
			setup: func(t *testing.T) string {
				d := filepath.Join(shortDir(t), "run")
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
				os.Chmod(d, 0o755)
				return filepath.Join(d, "bcd.sock")
			},
			want: []string{"/run is open to group or others (mode 0755)", "chmod 0700 "},
		},
		{
			name: "group-readable directory",
			setup: func(t *testing.T) string {
				d := filepath.Join(shortDir(t), "run")
				os.Mkdir(d, 0o750)
				os.Chmod(d, 0o750)
				return filepath.Join(d, "bcd.sock")
			},
			want: []string{"mode 0750", "chmod 0700"},
		},
		{
			name: "directory is a file",
			setup: func(t *testing.T) string {
				f := filepath.Join(shortDir(t), "run")
				os.WriteFile(f, nil, 0o600)
				return filepath.Join(f, "bcd.sock")
			},
			want: []string{"is not a directory"},
		},
		{
			name: "a regular file at the socket path",
			setup: func(t *testing.T) string {
				p := filepath.Join(shortDir(t), "bcd.sock")
				os.WriteFile(p, []byte("keep me"), 0o600)
				return p
			},
			want: []string{"exists and is not a socket"},
		},
		{
			name: "a socket another process serves",
			setup: func(t *testing.T) string {
				p := filepath.Join(shortDir(t), "bcd.sock")
				l, err := net.Listen("unix", p)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close() })
				return p
			},
			want: []string{"served by another process"},
		},
		{
			name:  "no path",
			setup: func(t *testing.T) string { return "" },
			want:  []string{"no path"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := Serve(ctx, path, sample, nil)
			if err == nil {
				t.Fatal("Serve started")
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
		})
	}
	// The refused regular file is left alone.
	p := filepath.Join(shortDir(t), "bcd.sock")
	os.WriteFile(p, []byte("keep me"), 0o600)
	Serve(context.Background(), p, sample, nil)
	if b, _ := os.ReadFile(p); string(b) != "keep me" {
		t.Errorf("a file at the socket path was changed: %q", b)
	}
}

func TestSlowClientDoesNotBlockOthers(t *testing.T) {
	path := filepath.Join(shortDir(t), "bcd.sock")
	var served atomic.Int32
	start(t, path, func() Snapshot { served.Add(1); return sample() }, 300*time.Millisecond)

	// Clients that connect and say nothing, and one that sends half a line.
	var slow []net.Conn
	for range 3 {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		slow = append(slow, c)
	}
	io.WriteString(slow[2], "sta")

	begin := time.Now()
	for range 5 {
		if _, err := Read(context.Background(), path); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(begin); d > 250*time.Millisecond {
		t.Errorf("reads took %s beside slow clients", d)
	}
	if n := served.Load(); n != 5 {
		t.Errorf("snapshots taken %d, want 5", n)
	}
	// The slow clients are dropped at the deadline, unanswered.
	for i, c := range slow {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b, err := io.ReadAll(c)
		if len(b) != 0 || err != nil {
			t.Errorf("slow client %d: got %q, %v; want a close without an answer", i, b, err)
		}
	}
}

func TestServeStopsWithOpenConnections(t *testing.T) {
	path := filepath.Join(shortDir(t), "bcd.sock")
	stop := start(t, path, sample, time.Hour)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(20 * time.Millisecond) // let the server accept it
	begin := time.Now()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("Serve took %s to stop with an idle client", d)
	}
}

func TestValidFor(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		notAfter time.Time
		want     string
	}{
		{time.Time{}, ""},
		{now.Add(14*time.Hour + 12*time.Minute + 20*time.Second), "14h12m0s"},
		{now.Add(42*time.Second + 300*time.Millisecond), "42s"},
		{now, "expired"},
		{now.Add(-time.Hour), "expired"},
	}
	for _, tt := range tests {
		if got := ValidFor(tt.notAfter, now); got != tt.want {
			t.Errorf("ValidFor(%v) = %q, want %q", tt.notAfter, got, tt.want)
		}
	}
}

func TestRender(t *testing.T) {
	tests := []struct {
		name string
		s    Snapshot
		want string
	}{
		{
			name: "full",
			s:    sample(),
			want: `node        node_01k5w (site fsn1, role node)
boot        3f1c2d4e, version 0.1.0
gateway     https://gw.eu-1.example.com, connected since 2026-09-26T08:00:00Z (epoch 7)
clock       offset -12ms, time mark 2026-09-26T08:12:00Z
trust       bundle version 2; signed intent enforced (1 command-signing roots)
generation  applied 4, observed 3
  fakehw    CONVERGED at generation 4 since 2026-09-26T08:10:00Z
  site      RETRYING at generation 4 since 2026-09-26T08:11:00Z, 2 attempts: apply: pull failed
    keep 1 cache images
lanes       control 3/4 free, provision 2/2 free
events      backlog 3, dropped 1; results unacked 2
certificate valid for 14h12m0s (until 2026-09-26T22:12:00Z)
node key    in a file
running     1
  cmd_01 agent.ping, lane control, since 2026-09-26T08:01:00Z
deferred    1
  cmd_02 gpu.hold, lane provision, since 2026-09-26T08:02:00Z
gpus        1
  0 GPU-5f1c NVIDIA H100 80GB HBM3: 87% 61 C 540/700 W 71.2/79.6 GiB
`,
		},
		{
			name: "host units and conditions",
			s: Snapshot{HostUnits: []HostUnit{{Name: "sysctl", State: "CONVERGED"}, {Name: "iommu", State: "CONVERGED"},
				{Name: "k8s-join", State: "UNSUPPORTED", Message: "unsupported: k8s-join waits for the Kubernetes work"},
				{Name: "hugepages", State: "CHANGING", Changes: []string{"set the 2 MiB pool to 64 pages (now 0)"}}},
				Conditions: []Condition{{Type: "RebootRequired", Subject: "host", Message: "iommu: the running kernel's command line lacks iommu=pt",
					Since: time.Date(2026, 9, 26, 8, 0, 0, 0, time.UTC)}}},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
    unit    sysctl CONVERGED
    unit    iommu CONVERGED
    unit    k8s-join UNSUPPORTED: unsupported: k8s-join waits for the Kubernetes work
    unit    hugepages CHANGING
    set the 2 MiB pool to 64 pages (now 0)
conditions  1
  RebootRequired host since 2026-09-26T08:00:00Z: iommu: the running kernel's command line lacks iommu=pt
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
`,
		},
		{
			name: "instances",
			s: Snapshot{InstancesComplete: new(true), Instances: []Instance{{ID: "byhand", State: "STOPPED"}, {ID: "vm-a", State: "RUNNING", Owned: true},
				{ID: "vm-b", Failed: "base image refused: SHA-256 differs"}}},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
instances   3, complete
  byhand STOPPED not bcd's (never touched)
  vm-a RUNNING
  vm-b - failed: base image refused: SHA-256 differs
`,
		},
		{
			name: "taps",
			s: Snapshot{Taps: []Tap{{Tap: "bcdt0123456789a0", Instance: "vm-a", Policy: "PRIVATE", State: "GUARDED"},
				{Tap: "bcdtabcdefabcd0", Instance: "vm-h", Policy: "EGRESS", State: "FAILED", Reason: "nics[0]: address 10.9.0.1 is the host bridge br0's own"}}},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
taps        2
  bcdt0123456789a0 vm-a PRIVATE GUARDED
  bcdtabcdefabcd0 vm-h EGRESS FAILED: nics[0]: address 10.9.0.1 is the host bridge br0's own
`,
		},
		{
			name: "a tunnel",
			s: Snapshot{Tunnels: []Tunnel{{ID: "t1", Kind: "ssh", Account: "alice", JTI: "j1",
				Opened: time.Date(2026, 9, 26, 8, 0, 0, 0, time.UTC), Expires: time.Date(2026, 9, 26, 8, 15, 0, 0, time.UTC), BytesIn: 10, BytesOut: 20}}},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
tunnels     1
  t1 ssh as alice, ticket j1, since 2026-09-26T08:00:00Z, until 2026-09-26T08:15:00Z, 10 bytes in, 20 out
`,
		},
		{
			name: "telemetry",
			s: Snapshot{Telemetry: &Telemetry{Endpoint: "https://otel.example.internal:4318", Interval: "1m0s",
				LastExport: time.Date(2026, 9, 26, 8, 12, 0, 0, time.UTC), LastError: "export to https://otel.example.internal:4318: connection refused",
				LastErrorAt: time.Date(2026, 9, 26, 8, 11, 0, 0, time.UTC), ExportedPoints: 400, DroppedPoints: 2, PendingBatches: 1}},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
telemetry   https://otel.example.internal:4318, last export 2026-09-26T08:12:00Z, last error 2026-09-26T08:11:00Z: export to https://otel.example.internal:4318: connection refused (400 points exported, 2 dropped, 1 batches waiting)
`,
		},
		{
			name: "empty",
			s:    Snapshot{},
			want: `node        - (site -, role -)
boot        -, version -
gateway     -, not connected
clock       offset +0ms, time mark -
trust       bundle version 0; signed intent NOT enforced (no command-signing roots)
generation  applied 0, observed 0
lanes       -
events      backlog 0, dropped 0; results unacked 0
certificate -
node key    -
running     0
deferred    0
gpus        0
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			Render(&b, tt.s)
			if b.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestRenderLines(t *testing.T) {
	s := sample()
	s.Connected = false
	s.CertificateValidFor = "expired"
	s.KeyHolder = KeyInTPM
	s.Site = "evil\n\x1b[2Jsite"
	var b bytes.Buffer
	Render(&b, s)
	out := b.String()
	for _, want := range []string{
		"gateway     https://gw.eu-1.example.com, not connected (last epoch 7)\n",
		"certificate expired at 2026-09-26T22:12:00Z\n",
		"node key    in the TPM\n",
		"(site evil??[2Jsite, role node)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "\n") != 19 { // 16 lines and the three of the sections
		t.Errorf("a value broke a line:\n%s", out)
	}
}

func testEnv() (*cli.Env, *bytes.Buffer, *bytes.Buffer) {
	var stdout, stderr bytes.Buffer
	return &cli.Env{
		Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr,
		Getenv: func(string) string { return "" }, Unsetenv: func(string) error { return nil },
	}, &stdout, &stderr
}

func TestCommand(t *testing.T) {
	dir := shortDir(t)
	path := filepath.Join(dir, "bcd.sock")
	start(t, path, sample, ConnTimeout)
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte("gateway = \"https://gw.example.com\"\nsocket_path = \""+path+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badCfg := filepath.Join(dir, "bad.toml")
	os.WriteFile(badCfg, []byte("gatewya = 1\n"), 0o600)
	missing := filepath.Join(dir, "missing.sock")

	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string
		stderr     []string
		jsonOutput bool
	}{
		{name: "text via config", args: []string{"--config", cfgPath}, code: 0, stdout: []string{"node        node_01k5w (site fsn1, role node)\n", "  0 GPU-5f1c"}},
		{name: "json via socket", args: []string{"--socket", path, "--json"}, code: 0, jsonOutput: true},
		{name: "socket overrides config", args: []string{"--config", badCfg, "--socket", path}, code: 0, stdout: []string{"gpus        1"}},
		{name: "no agent", args: []string{"--socket", missing}, code: 1, stderr: []string{"bcd status: connect to the status socket", "is bcd node running? socket_path = " + missing}},
		{name: "config does not load", args: []string{"--config", badCfg}, code: 1, stderr: []string{"unknown key \"gatewya\""}},
		{name: "named config missing", args: []string{"--config", filepath.Join(dir, "none.toml")}, code: 1, stderr: []string{"find the status socket"}},
		{name: "positional", args: []string{"x"}, code: 2, stderr: []string{"takes no positional arguments"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env, stdout, stderr := testEnv()
			code := Command().Run(context.Background(), env, tt.args)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, stderr)
				}
			}
			if tt.jsonOutput {
				var got Snapshot
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
					t.Fatalf("not JSON: %v\n%s", err, stdout)
				}
				if !reflect.DeepEqual(got, sample()) {
					t.Errorf("JSON %+v", got)
				}
			}
		})
	}
}
