//go:build linux

package helper

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/tpm"
)

// syncBuffer is a log sink the server's goroutines share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines decodes the JSON log lines whose msg is msg.
func (s *syncBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// testHelper is a helper serving in a temporary directory: the file
// table's root is dir/root, the socket dir/run/helper.sock.
type testHelper struct {
	dir, root, socket string
	logs              *syncBuffer
	client            *helperclient.Client
	uid, gid          uint32 // the [helper] user
}

// testSeams lets the helper run as whoever runs the test: as root its
// user is a fake unprivileged uid and gid; otherwise it is the test's own
// user in a fakehw-like mode.
func testSeams(dir string) (seams, uint32, uint32) {
	s := hostSeams()
	s.top = dir
	s.root = filepath.Join(dir, "root")
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	if s.euid == 0 {
		uid, gid = 4242, 4242
		s.fakeHW = false // a host helper, in a fakehw test build too
	} else {
		s.fakeHW = true
	}
	s.lookupUser = func(name string) (uint32, uint32, error) {
		if name != "bcd" {
			return 0, 0, fmt.Errorf("user: unknown user %s", name)
		}
		return uid, gid, nil
	}
	s.nft = func(context.Context, []byte, ...string) ([]byte, error) { return nil, errNoNft }
	s.reboot = func(context.Context, string) error { return errors.New("tests never reboot") }
	s.systemctl = func(context.Context, ...string) ([]byte, error) { return nil, errors.New("tests never run systemctl") }
	s.smi = func(context.Context, ...string) ([]byte, error) { return nil, errNoSMI }
	s.fakeGPUs = func() []string { return nil }
	s.topology = func() (string, string, error) { return "0-3", "0", nil }
	s.gpuMinors = func() ([]int, error) { return []int{0, 1}, nil } // never the host's
	s.unitRoot = s.root
	s.cgroup = filepath.Join(dir, "cgroup")
	s.openTPM = func() (*tpm.TPM, error) { return nil, errNoTPM } // never the host's
	return s, uid, gid
}

func startHelper(t testing.TB, mod func(*Config, *seams)) *testHelper {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	s, uid, gid := testSeams(dir)
	h := &testHelper{dir: dir, root: s.root, socket: filepath.Join(dir, "run", "helper.sock"), logs: &syncBuffer{}, uid: uid, gid: gid}
	cfg := Config{Socket: h.socket, User: "bcd"}
	if mod != nil {
		mod(&cfg, &s)
	}
	ready := make(chan struct{})
	s.listening = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := slog.New(slog.NewJSONHandler(h.logs, nil))
	go func() { done <- serve(ctx, cfg, log, s) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("the helper did not start listening")
	}
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("the helper did not stop")
		}
	})
	h.client = &helperclient.Client{Socket: h.socket}
	return h
}

// raw sends data on one connection and returns the answer.
func (h *testHelper) raw(t *testing.T, data []byte) string {
	t.Helper()
	c, err := net.Dial("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(data); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.(*net.UnixConn).CloseWrite()
	b, err := io.ReadAll(c)
	if err != nil && len(b) == 0 {
		t.Fatalf("read: %v", err)
	}
	return string(b)
}

// snapshot records every file under dirs: type, mode, owner, content or
// link target.
func snapshot(t *testing.T, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			st := fi.Sys().(*syscall.Stat_t)
			v := fmt.Sprintf("%v uid=%d", fi.Mode(), st.Uid)
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				v += " -> " + l
			case fi.Mode().IsRegular():
				b, _ := os.ReadFile(p)
				v += " " + string(b)
			}
			out[p] = v
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func sameSnapshot(t *testing.T, before, after map[string]string) {
	t.Helper()
	for p, v := range before {
		if after[p] != v {
			t.Errorf("%s changed: %q, now %q", p, v, after[p])
		}
	}
	for p, v := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared: %q", p, v)
		}
	}
}

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFileWriteAndRemove(t *testing.T) {
	h := startHelper(t, nil)
	ctx := context.Background()
	spec := holdSpec(t, "gpu0", "/dev/nvidia0")
	if err := h.client.WriteFile(ctx, "/etc/cdi/bcd-gpu0.json", spec); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.root, "etc/cdi/bcd-gpu0.json")
	assertFile(t, p, spec, 0o644)
	for _, d := range []string{"etc", "etc/cdi"} {
		fi, err := os.Stat(filepath.Join(h.root, d))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v, want a 0755 directory", d, fi.Mode(), err)
		}
	}
	// Replace it.
	spec = holdSpec(t, "gpu0", "/dev/nvidia1")
	if err := h.client.WriteFile(ctx, "/etc/cdi/bcd-gpu0.json", spec); err != nil {
		t.Fatal(err)
	}
	assertFile(t, p, spec, 0o644)
	// The k8s token is 0600.
	if err := h.client.WriteFile(ctx, "/var/lib/bcd-hostconfig/k8s/bootstrap-token", []byte("abcdef.0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(h.root, "var/lib/bcd-hostconfig/k8s/bootstrap-token"), []byte("abcdef.0123456789abcdef"), 0o600)
	// Anything but a bootstrap token is refused, the file left as it was.
	if err := h.client.WriteFile(ctx, "/var/lib/bcd-hostconfig/k8s/bootstrap-token", nil); err == nil || !strings.Contains(err.Error(), "0 bytes: a k8s-token file holds one kubeadm bootstrap token") {
		t.Fatalf("an empty k8s token: %v", err)
	}
	assertFile(t, filepath.Join(h.root, "var/lib/bcd-hostconfig/k8s/bootstrap-token"), []byte("abcdef.0123456789abcdef"), 0o600)

	if err := h.client.RemoveFile(ctx, "/etc/cdi/bcd-gpu0.json"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after file.remove: %v", err)
	}
	// Removing what is not there (a file, or its directory) succeeds.
	if err := h.client.RemoveFile(ctx, "/etc/cdi/bcd-gpu0.json"); err != nil {
		t.Fatal(err)
	}
	if err := h.client.RemoveFile(ctx, "/run/bcd-alloc/a1.env"); err != nil {
		t.Fatal(err)
	}
	// No temporary file is left behind.
	filepath.WalkDir(h.root, func(p string, e fs.DirEntry, err error) error {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
	// Every operation is logged with the peer's pid, op, kind, id and outcome.
	ops := h.logs.lines(t, "helper: operation")
	if len(ops) != 7 {
		t.Fatalf("%d operations logged, want 7:\n%s", len(ops), h.logs.String())
	}
	first := ops[0]
	if first["pid"] != float64(os.Getpid()) || first["op"] != "file.write" || first["kind"] != "cdi" || first["id"] != "gpu0" || first["outcome"] != "ok" {
		t.Errorf("log line %v", first)
	}
	if ops[5]["outcome"] != "absent" || ops[6]["kind"] != "allocation-env" {
		t.Errorf("log lines %v, %v", ops[5], ops[6])
	}
}

func assertFile(t *testing.T, p string, want []byte, mode fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Errorf("%s: mode %v, want a regular file %o", p, fi.Mode(), mode)
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() {
		t.Errorf("%s: owned by %d", p, st.Uid)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, want) {
		t.Errorf("%s = %q, want %q", p, got, want)
	}
}

// TestRefusalsChangeNothing: each refused request leaves the disk as it
// was, and its caller gets an answer that says why.
func TestRefusalsChangeNothing(t *testing.T) {
	h := startHelper(t, nil)
	outside := filepath.Join(h.dir, "outside")
	mkdirs(t, h.dir, "outside/cdi")
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, h.root, "etc/cdi", "etc/ssh/sshd_config.d", "run", "var/lib", "etc/cdi/bcd-dir.json")
	// A symlink planted at a target, one on the way, a directory at a
	// target, a directory others can write.
	must(t, os.Symlink(filepath.Join(outside, "victim"), filepath.Join(h.root, "etc/cdi/bcd-planted.json")))
	must(t, os.Symlink(filepath.Join(outside, "cdi"), filepath.Join(h.root, "run/bcd-alloc")))
	must(t, os.Mkdir(filepath.Join(h.root, "etc/ssh/bc_principals"), 0o755))
	must(t, os.Mkdir(filepath.Join(h.root, "etc/ssh/bc_principals/alice"), 0o755))
	must(t, os.Mkdir(filepath.Join(h.root, "var/lib/bcd-hostconfig"), 0o755))
	must(t, os.Chmod(filepath.Join(h.root, "var/lib/bcd-hostconfig"), 0o775))

	data := base64.StdEncoding.EncodeToString([]byte("evil"))
	token := base64.StdEncoding.EncodeToString([]byte("abcdef.0123456789abcdef"))
	// Content a hold's file check passes, so the walker's refusals show.
	planted := base64.StdEncoding.EncodeToString(holdSpec(t, "planted", "/dev/nvidia0"))
	env := base64.StdEncoding.EncodeToString([]byte("BCD_ALLOCATION=a1\n"))
	tests := []struct {
		name, req, wantErr string
	}{
		{"unknown field", `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"` + data + `","path":"/etc/passwd"}`, `unknown field \"path\"`},
		{"other version", `{"v":2,"op":"file.write","kind":"cdi","id":"x","data":"` + data + `"}`, "protocol version 2"},
		{"field in another case", `{"v":1,"Op":"file.write","kind":"cdi","id":"x"}`, `unknown field \"Op\"`},
		{"field twice", `{"v":1,"op":"file.write","kind":"cdi","id":"x","id":"y","data":"` + data + `"}`, "given twice"},
		{"two requests", `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"` + data + `"}{"v":1,"op":"file.write","kind":"cdi","id":"y","data":"` + data + `"}`, "more than one JSON value"},
		{"kind outside the table", `{"v":1,"op":"file.write","kind":"passwd","data":"` + data + `"}`, "unknown file kind"},
		{"id with a path", `{"v":1,"op":"file.write","kind":"cdi","id":"../../outside/victim","data":"` + data + `"}`, "does not fit file kind cdi"},
		{"id on a kind without one", `{"v":1,"op":"file.write","kind":"k8s-token","id":"x","data":"` + data + `"}`, "takes no id"},
		{"id ..", `{"v":1,"op":"file.write","kind":"cdi","id":"..","data":"` + data + `"}`, "does not fit"},
		{"sshd drop-in as content", `{"v":1,"op":"file.write","kind":"ssh-dropin","data":"` + data + `"}`, "written only by access.apply"},
		{"sshd CA as content", `{"v":1,"op":"file.write","kind":"ssh-ca","data":"` + data + `"}`, "written only by access.apply"},
		{"principals as content", `{"v":1,"op":"file.write","kind":"ssh-principals","id":"alice","data":"` + data + `"}`, "written only by access.apply"},
		{"symlink at the target", `{"v":1,"op":"file.write","kind":"cdi","id":"planted","data":"` + planted + `"}`, "bcd-planted.json is a symlink"},
		{"remove a symlink at the target", `{"v":1,"op":"file.remove","kind":"cdi","id":"planted"}`, "bcd-planted.json is a symlink"},
		{"symlink on the way", `{"v":1,"op":"file.write","kind":"allocation-env","id":"a1","data":"` + env + `"}`, "bcd-alloc is a symlink"},
		{"remove through a symlink on the way", `{"v":1,"op":"file.remove","kind":"allocation-env","id":"a1"}`, "bcd-alloc is a symlink"},
		{"directory at the target", `{"v":1,"op":"file.remove","kind":"cdi","id":"dir"}`, "is not a regular file"},
		{"directory others can write", `{"v":1,"op":"file.write","kind":"k8s-token","data":"` + token + `"}`, "can be written by group or others"},
		{"file too large", `{"v":1,"op":"file.write","kind":"k8s-token","data":"` + base64.StdEncoding.EncodeToString(make([]byte, 1<<20+1)) + `"}`, "more than 1048576"},
		{"CDI spec too large", `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"` + base64.StdEncoding.EncodeToString(make([]byte, 64<<10+1)) + `"}`, "CDI spec is 65537 bytes; at most 65536"},
		{"CDI spec that is not one", `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"` + data + `"}`, "file.write /etc/cdi/bcd-x.json: CDI spec: invalid character"},
		{"environment file that is not one", `{"v":1,"op":"file.write","kind":"allocation-env","id":"x","data":"` + data + `"}`, "file.write /run/bcd-alloc/x.env: environment file: the last line has no newline"},
		{"request over 4 MiB", `{"v":1,"op":"file.write","kind":"cdi","id":"x","data":"` + data + `"}` + strings.Repeat(" ", wire.MaxRequest), "larger than 4194304 bytes"},
		{"not JSON", `file.write /etc/passwd`, "not JSON"},
		{"unknown op", `{"v":1,"op":"file.chmod","kind":"cdi","id":"x"}`, "unknown operation"},
		// Rules are rendered by the helper from typed policies (the
		// instances' network); no operation takes ruleset text.
		{"firewall.apply is no operation", `{"v":1,"op":"firewall.apply"}`, "unknown operation"},
		{"ruleset is no field", `{"v":1,"op":"firewall.check","rules":1,"ruleset":"flush ruleset"}`, "ruleset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, h.root, outside)
			got := h.raw(t, []byte(tt.req))
			if !strings.Contains(got, tt.wantErr) || !strings.HasPrefix(got, `{"v":1,"ok":false,"error":`) || !strings.HasSuffix(got, `"retryable":false}`) {
				t.Errorf("answer %s, want a refusal containing %s", got, tt.wantErr)
			}
			sameSnapshot(t, before, snapshot(t, h.root, outside))
		})
	}
	if n := len(h.logs.lines(t, "helper: operation")); n != len(tests) {
		t.Errorf("%d operations logged, want %d", n, len(tests))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRequestOfExactly4MiB: 4 MiB is served, 4 MiB and one byte refused.
func TestRequestOfExactly4MiB(t *testing.T) {
	h := startHelper(t, nil)
	req := `{"v":1,"op":"file.write","kind":"k8s-token","data":"YWJjZGVmLjAxMjM0NTY3ODlhYmNkZWY="}`
	if got := h.raw(t, []byte(req+strings.Repeat(" ", wire.MaxRequest-len(req)))); got != `{"v":1,"ok":true}` {
		t.Fatalf("answer %s", got)
	}
	assertFile(t, filepath.Join(h.root, "var/lib/bcd-hostconfig/k8s/bootstrap-token"), []byte("abcdef.0123456789abcdef"), 0o600)
}

// TestBusy: with 32 requests in flight the 33rd is answered busy, which
// is retryable, and changes nothing; the 32 then finish.
func TestBusy(t *testing.T) {
	var held atomic.Int32
	release := make(chan struct{})
	h := startHelper(t, func(_ *Config, s *seams) {
		s.hold = func(string) {
			held.Add(1)
			<-release
		}
	})
	ctx := context.Background()
	errs := make(chan error, maxInFlight)
	for i := range maxInFlight {
		id := fmt.Sprintf("c%d", i)
		spec := holdSpec(t, id, "/dev/nvidia0")
		go func() { errs <- h.client.WriteFile(ctx, "/etc/cdi/bcd-"+id+".json", spec) }()
	}
	deadline := time.Now().Add(20 * time.Second)
	for held.Load() < maxInFlight {
		if time.Now().After(deadline) {
			t.Fatalf("only %d requests in flight", held.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	c32 := holdSpec(t, "c32", "/dev/nvidia0")
	err := h.client.WriteFile(ctx, "/etc/cdi/bcd-c32.json", c32)
	var herr *helperclient.Error
	if !errors.As(err, &herr) || !herr.Retryable || !strings.Contains(herr.Msg, "busy") || !helperclient.IsRetryable(err) {
		t.Fatalf("33rd request: %v, want a retryable busy answer", err)
	}
	if _, err := os.Lstat(filepath.Join(h.root, "etc/cdi/bcd-c32.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the busy request wrote its file: %v", err)
	}
	close(release)
	busy := 1
	for range maxInFlight {
		if err := <-errs; err != nil {
			if errors.As(err, &herr) && strings.Contains(herr.Msg, "busy") {
				busy++
			}
			t.Errorf("a request in flight: %v", err)
		}
	}
	if busy != 1 {
		t.Errorf("%d busy answers, want exactly 1", busy)
	}
	if held.Load() != maxInFlight {
		t.Errorf("%d requests ran, want %d", held.Load(), maxInFlight)
	}
	// A slot is free again.
	if err := h.client.WriteFile(ctx, "/etc/cdi/bcd-c32.json", c32); err != nil {
		t.Fatal(err)
	}
}

// TestPeerRefused: another uid, the right uid with another primary group,
// and a binary that is not bcd each get only "not allowed", logged with
// pid, uid and reason; the entrypoint is allowed.
func TestPeerRefused(t *testing.T) {
	other := filepath.Join(t.TempDir(), "python3")
	must(t, os.WriteFile(other, []byte("#!/bin/false\n"), 0o755))
	var peer atomic.Value // peerCred
	var exe atomic.Value  // string: the file the caller runs
	var entry string
	h := startHelper(t, func(c *Config, s *seams) {
		entry = filepath.Join(s.top, "bin", "bcd-node")
		must(t, os.Mkdir(filepath.Dir(entry), 0o755))
		must(t, os.WriteFile(entry, []byte("#!/bin/false\n"), 0o755))
		c.Entrypoint = entry
		s.peer = func(*net.UnixConn) (peerCred, error) { return peer.Load().(peerCred), nil }
		s.exe = func(_ *net.UnixConn, pid int32) (os.FileInfo, error) { return os.Stat(exe.Load().(string)) }
	})
	self, _ := os.Executable()
	user := peerCred{pid: 1234, uid: h.uid, gid: h.gid}
	tests := []struct {
		name   string
		peer   peerCred
		exe    string
		reason string // "" when allowed
	}{
		{"the user running the helper's binary", user, self, ""},
		{"root running the helper's binary", peerCred{pid: 1, uid: 0, gid: 0}, self, ""},
		{"the user running the entrypoint", user, entry, ""},
		{"another uid", peerCred{pid: 1235, uid: 31337, gid: h.gid}, self, "uid 31337 gid"},
		{"the user with another primary group", peerCred{pid: 1236, uid: h.uid, gid: h.gid + 1}, self, "is neither bcd"},
		{"a binary that is not bcd", user, other, "/proc/1234/exe is not bcd"},
	}
	if h.uid == 0 {
		t.Fatal("the test user is root")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer.Store(tt.peer)
			exe.Store(tt.exe)
			before := snapshot(t, h.root)
			err := h.client.WriteFile(context.Background(), "/etc/cdi/bcd-peer.json", holdSpec(t, "peer", "/dev/nvidia1"))
			if tt.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var herr *helperclient.Error
			if !errors.As(err, &herr) || herr.Msg != "not allowed" || herr.Retryable {
				t.Fatalf("err = %v, want only \"not allowed\"", err)
			}
			sameSnapshot(t, before, snapshot(t, h.root))
			refused := h.logs.lines(t, "helper: connection refused")
			last := refused[len(refused)-1]
			if last["pid"] != float64(tt.peer.pid) || last["uid"] != float64(tt.peer.uid) || !strings.Contains(last["reason"].(string), tt.reason) {
				t.Errorf("logged %v, want pid %d uid %d and a reason containing %q", last, tt.peer.pid, tt.peer.uid, tt.reason)
			}
		})
	}
}

// TestSocket: the socket is 0660 with the user's primary group, the
// private directory is gone, a stale socket is replaced, and the socket
// is removed when the helper stops.
func TestSocket(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "root"), 0o755))
	must(t, os.Mkdir(filepath.Join(dir, "run"), 0o755))
	socket := filepath.Join(dir, "run", "helper.sock")
	must(t, os.WriteFile(socket, []byte("stale"), 0o644))
	s, _, gid := testSeams(dir)
	ready := make(chan struct{})
	s.listening = func() { close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, Config{Socket: socket, User: "bcd"}, nil, s) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	fi, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a 0660 socket", fi.Mode())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != gid || int(st.Uid) != os.Geteuid() {
		t.Errorf("socket owned by %d:%d, want %d:%d", st.Uid, st.Gid, os.Geteuid(), gid)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "run"))
	if len(entries) != 1 {
		t.Errorf("socket directory holds %v, want the socket alone", entries)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket left after stop: %v", err)
	}
}

// TestStartRefusals: the helper refuses to start, before it listens,
// with the messages docs/helper.md gives.
func TestStartRefusals(t *testing.T) {
	root := os.Geteuid() == 0
	owner := "root"
	if !root {
		owner = fmt.Sprintf("uid %d", os.Geteuid())
	}
	tests := []struct {
		name     string
		rootOnly bool
		setup    func(t *testing.T, dir string, c *Config, s *seams)
		wantErr  string
	}{
		{name: "no socket", setup: func(t *testing.T, dir string, c *Config, s *seams) { c.Socket = "" },
			wantErr: "[helper] socket and user are not configured"},
		{name: "no user", setup: func(t *testing.T, dir string, c *Config, s *seams) { c.User = "" },
			wantErr: "[helper] socket and user are not configured"},
		{name: "not root", setup: func(t *testing.T, dir string, c *Config, s *seams) { s.euid, s.fakeHW = 1000, false },
			wantErr: "runs as root (this process runs as uid 1000"},
		{name: "unknown user", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			s.lookupUser = lookupUser
			c.User = "bcd-no-such-user-x1"
		}, wantErr: "helper.user: user: unknown user bcd-no-such-user-x1"},
		{name: "config group-writable", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			c.ConfigFile = filepath.Join(dir, "config.toml")
			must(t, os.WriteFile(c.ConfigFile, nil, 0o600))
			must(t, os.Chmod(c.ConfigFile, 0o620))
		}, wantErr: "config.toml must be a regular file " + owner + " owns that no one else can write"},
		{name: "config a symlink", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.WriteFile(filepath.Join(dir, "real.toml"), nil, 0o600))
			c.ConfigFile = filepath.Join(dir, "config.toml")
			must(t, os.Symlink(filepath.Join(dir, "real.toml"), c.ConfigFile))
		}, wantErr: "config.toml must be a regular file " + owner + " owns that no one else can write"},
		{name: "config not root's", rootOnly: true, setup: func(t *testing.T, dir string, c *Config, s *seams) {
			c.ConfigFile = filepath.Join(dir, "config.toml")
			must(t, os.WriteFile(c.ConfigFile, nil, 0o600))
			must(t, os.Chown(c.ConfigFile, 65534, 65534))
		}, wantErr: "config.toml must be a regular file root owns that no one else can write"},
		{name: "config's directory writable by others", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.Mkdir(filepath.Join(dir, "etc"), 0o755))
			must(t, os.Chmod(filepath.Join(dir, "etc"), 0o757))
			c.ConfigFile = filepath.Join(dir, "etc", "config.toml")
			must(t, os.WriteFile(c.ConfigFile, nil, 0o600))
		}, wantErr: "etc must be a directory " + owner + " owns that no one else can write (its configuration is there)"},
		{name: "socket directory writable by others", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.Mkdir(filepath.Join(dir, "run"), 0o755))
			must(t, os.Chmod(filepath.Join(dir, "run"), 0o1777))
		}, wantErr: "run must be a directory " + owner + " owns that no one else can write (the helper socket lives there)"},
		{name: "socket directory not root's", rootOnly: true, setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.Mkdir(filepath.Join(dir, "run"), 0o755))
			must(t, os.Chown(filepath.Join(dir, "run"), 65534, 65534))
		}, wantErr: "run must be a directory root owns that no one else can write (the helper socket lives there)"},
		{name: "socket directory a symlink", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.Mkdir(filepath.Join(dir, "elsewhere"), 0o755))
			must(t, os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "run")))
		}, wantErr: "run must be a directory " + owner + " owns that no one else can write (the helper socket lives there)"},
		{name: "entrypoint others can write", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			c.Entrypoint = filepath.Join(dir, "bcd-node")
			must(t, os.WriteFile(c.Entrypoint, nil, 0o755))
			must(t, os.Chmod(c.Entrypoint, 0o777))
		}, wantErr: "bcd-node must be a regular file " + owner + " owns that no one else can write ([helper] entrypoint)"},
		{name: "entrypoint links into a directory others can write", setup: func(t *testing.T, dir string, c *Config, s *seams) {
			must(t, os.Mkdir(filepath.Join(dir, "slots"), 0o755))
			must(t, os.Chmod(filepath.Join(dir, "slots"), 0o777))
			must(t, os.WriteFile(filepath.Join(dir, "slots", "bcd-a"), nil, 0o755))
			c.Entrypoint = filepath.Join(dir, "bcd-node")
			must(t, os.Symlink(filepath.Join(dir, "slots", "bcd-a"), c.Entrypoint))
		}, wantErr: "slots must be a directory " + owner + " owns that no one else can write ([helper] entrypoint links there)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.rootOnly && !root {
				testenv.NeedRoot(t, "to give a file to another user")
			}
			dir := t.TempDir()
			s, _, _ := testSeams(dir)
			c := Config{Socket: filepath.Join(dir, "run", "helper.sock"), User: "bcd"}
			tt.setup(t, dir, &c, &s)
			s.listening = func() { t.Error("the helper listened") }
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := serve(ctx, c, nil, s)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
			if _, err := os.Lstat(c.Socket); c.Socket != "" && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket created: %v", err)
			}
		})
	}
}

// TestStartsWithGoodConfig: a config.toml and entrypoint that are the
// owner's alone pass; a fakehw build need not be root.
func TestStartsWithGoodConfig(t *testing.T) {
	h := startHelper(t, func(c *Config, s *seams) {
		c.ConfigFile = filepath.Join(s.top, "config.toml")
		must(t, os.WriteFile(c.ConfigFile, nil, 0o600))
		c.Entrypoint = filepath.Join(s.top, "bcd-node")
		must(t, os.WriteFile(filepath.Join(s.top, "bcd-a"), nil, 0o755))
		must(t, os.Symlink(filepath.Join(s.top, "bcd-a"), c.Entrypoint))
		s.euid, s.fakeHW = os.Geteuid(), true
	})
	if err := h.client.WriteFile(context.Background(), "/var/lib/bcd-hostconfig/k8s/bootstrap-token", []byte("abcdef.0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
}

type nftCall struct {
	args  string
	stdin string
}

// TestFirewall: check counts the three tables' rules.
func TestFirewall(t *testing.T) {
	var mu sync.Mutex
	var calls []nftCall
	absent := map[string]bool{}
	noNft := false
	h := startHelper(t, func(_ *Config, s *seams) {
		s.nft = func(_ context.Context, stdin []byte, args ...string) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, nftCall{strings.Join(args, " "), string(stdin)})
			if noNft {
				return nil, errNoNft
			}
			if len(args) == 5 && args[1] == "list" {
				if absent[args[3]+" "+args[4]] {
					return nil, errNoTable
				}
				return []byte(`{"nftables":[{"table":{}},{"chain":{}},{"rule":{}},{"rule":{}}]}`), nil
			}
			return nil, nil
		}
	})
	ctx := context.Background()
	reset := func() []nftCall {
		mu.Lock()
		defer mu.Unlock()
		c := calls
		calls = nil
		return c
	}
	check := func(rules int64) *wire.Response {
		t.Helper()
		resp, err := h.client.Do(ctx, &wire.Request{V: 1, Op: wire.OpFirewallCheck, Rules: &rules})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := check(6); *r.Rules != 6 || !*r.Loaded {
		t.Errorf("check(6) = %d %v", *r.Rules, *r.Loaded)
	}
	if c := reset(); len(c) != 3 || c[0].args != "-j list table bridge bcd_instances" || c[2].args != "-j list table arp bcd_taps" {
		t.Errorf("nft calls %+v", c)
	}
	if r := check(5); *r.Rules != 6 || *r.Loaded {
		t.Errorf("check(5) = %d %v, want not loaded", *r.Rules, *r.Loaded)
	}
	mu.Lock()
	absent["arp bcd_taps"] = true
	mu.Unlock()
	if r := check(4); *r.Rules != 4 || !*r.Loaded {
		t.Errorf("an absent arp bcd_taps: check(4) = %d %v", *r.Rules, *r.Loaded)
	}
	mu.Lock()
	absent["bridge bcd_instances"] = true
	mu.Unlock()
	if r := check(2); *r.Loaded {
		t.Errorf("an absent bridge bcd_instances counts as loaded")
	}
	mu.Lock()
	noNft = true
	mu.Unlock()
	rules := int64(0)
	_, err := h.client.Do(ctx, &wire.Request{V: 1, Op: wire.OpFirewallCheck, Rules: &rules})
	var herr *helperclient.Error
	if !errors.As(err, &herr) || !strings.Contains(herr.Msg, "nft is not installed") || herr.Retryable {
		t.Errorf("without nft: %v", err)
	}
}

// TestReboot: a fakehw helper only logs a reboot, with the reason cut to
// 200 bytes; a host helper reboots.
func TestReboot(t *testing.T) {
	var rebooted atomic.Value
	h := startHelper(t, func(_ *Config, s *seams) {
		s.fakeHW = true
		s.reboot = func(_ context.Context, reason string) error { rebooted.Store(reason); return nil }
	})
	ctx := context.Background()
	if _, err := h.client.Do(ctx, &wire.Request{V: 1, Op: wire.OpReboot, Reason: strings.Repeat("r", 300)}); err != nil {
		t.Fatal(err)
	}
	if rebooted.Load() != nil {
		t.Error("a fakehw helper rebooted")
	}
	ops := h.logs.lines(t, "helper: operation")
	if r := ops[len(ops)-1]["reason"]; r != strings.Repeat("r", 200) {
		t.Errorf("logged reason %v", r)
	}

	testenv.NeedRoot(t, "a host (not fakehw) helper")
	h = startHelper(t, func(_ *Config, s *seams) {
		s.reboot = func(_ context.Context, reason string) error { rebooted.Store(reason); return nil }
	})
	if _, err := h.client.Do(ctx, &wire.Request{V: 1, Op: wire.OpReboot, Reason: "kernel " + strings.Repeat("é", 150)}); err != nil {
		t.Fatal(err)
	}
	if r, _ := rebooted.Load().(string); len(r) > 200 || !strings.HasPrefix(r, "kernel é") {
		t.Errorf("rebooted with reason %q (%d bytes)", r, len(r))
	}
}
