//go:build linux

package helper

import (
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
)

// execLog records the tools an operation ran, through the seams.
type execLog struct {
	mu    sync.Mutex
	calls []string
}

func (e *execLog) add(tool string, args []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, tool+" "+strings.Join(args, " "))
}

// take returns the calls so far and forgets them.
func (e *execLog) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.calls
	e.calls = nil
	return c
}

// opServer is a host (not fakehw) helper's operations over the test
// seams, without a socket: handle decodes, checks, runs and logs a request
// as a connection's would. It runs as any user: the operations' own
// checks do not depend on it.
type opServer struct {
	srv  *server
	root string // the unit root: dir/root
	logs *syncBuffer
	exec *execLog
}

func newOpServer(t *testing.T, mod func(s *seams, e *execLog)) *opServer {
	t.Helper()
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "root"), 0o755))
	s, _, _ := testSeams(dir)
	s.fakeHW = false
	s.euid = os.Geteuid()
	e := &execLog{}
	s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
		e.add("systemctl", args)
		return nil, nil
	}
	if mod != nil {
		mod(&s, e)
	}
	logs := &syncBuffer{}
	return &opServer{
		srv:  &server{s: s, log: slog.New(slog.NewJSONHandler(logs, nil))},
		root: s.unitRoot, logs: logs, exec: e,
	}
}

// call runs one request, given as JSON, and returns the answer.
func (o *opServer) call(t *testing.T, req string) *wire.Response {
	t.Helper()
	return o.srv.handle(context.Background(), peerCred{pid: 7, uid: 4242, gid: 4242}, []byte(req))
}

func wantOK(t *testing.T, r *wire.Response) {
	t.Helper()
	if !r.OK {
		t.Fatalf("answer %s, want ok", wire.EncodeResponse(r))
	}
}

func wantFailed(t *testing.T, r *wire.Response, contains string, retryable bool) {
	t.Helper()
	if r.OK || !strings.Contains(r.Error, contains) || r.Retryable != retryable {
		t.Fatalf("answer %s, want a failure containing %q with retryable %v", wire.EncodeResponse(r), contains, retryable)
	}
}

func wantCalls(t *testing.T, e *execLog, want ...string) {
	t.Helper()
	got := e.take()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ran %q, want %q", got, want)
	}
}

// TestPing: ping answers ok through the socket and is logged.
func TestPing(t *testing.T) {
	h := startHelper(t, nil)
	if _, err := h.client.Do(context.Background(), &wire.Request{V: 1, Op: wire.OpPing}); err != nil {
		t.Fatal(err)
	}
	if got := h.raw(t, []byte(`{"v":1,"op":"ping","gpu":"x"}`)); !strings.Contains(got, "ping takes no gpu") {
		t.Errorf("ping with a field: %s", got)
	}
	ops := h.logs.lines(t, "helper: operation")
	if len(ops) != 2 || ops[0]["op"] != "ping" || ops[0]["outcome"] != "ok" || ops[1]["outcome"] != "refused" {
		t.Errorf("logged %v", ops)
	}
}

// TestSSHReload: the helper reloads whichever of ssh.service and
// sshd.service systemd has loaded, and nothing when neither is.
func TestSSHReload(t *testing.T) {
	tests := []struct {
		name      string
		loaded    string // the unit systemd has loaded; "" none
		reloadErr error
		noTool    bool
		fakeHW    bool
		wantErr   string
		retryable bool
		want      []string
	}{
		{name: "ssh.service (Debian)", loaded: "ssh.service",
			want: []string{"systemctl show --property=LoadState --value ssh.service", "systemctl reload ssh.service"}},
		{name: "sshd.service", loaded: "sshd.service",
			want: []string{"systemctl show --property=LoadState --value ssh.service", "systemctl show --property=LoadState --value sshd.service", "systemctl reload sshd.service"}},
		{name: "neither", wantErr: "neither ssh.service nor sshd.service is loaded",
			want: []string{"systemctl show --property=LoadState --value ssh.service", "systemctl show --property=LoadState --value sshd.service"}},
		{name: "reload fails", loaded: "ssh.service", reloadErr: errors.New("systemctl reload ssh.service = exit status 1: Job failed"),
			wantErr: "Job failed", retryable: true,
			want: []string{"systemctl show --property=LoadState --value ssh.service", "systemctl reload ssh.service"}},
		{name: "no systemctl", noTool: true, wantErr: "systemctl is not installed"},
		{name: "fakehw only logs", loaded: "ssh.service", fakeHW: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOpServer(t, func(s *seams, e *execLog) {
				s.fakeHW = tt.fakeHW
				s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
					if tt.noTool {
						return nil, errNoSystemctl
					}
					e.add("systemctl", args)
					switch args[0] {
					case "show":
						if args[len(args)-1] == tt.loaded {
							return []byte("loaded\n"), nil
						}
						return []byte("not-found\n"), nil
					case "reload":
						return nil, tt.reloadErr
					}
					return nil, fmt.Errorf("unexpected systemctl %v", args)
				}
			})
			r := o.call(t, `{"v":1,"op":"ssh.reload"}`)
			if tt.wantErr == "" {
				wantOK(t, r)
			} else {
				wantFailed(t, r, tt.wantErr, tt.retryable)
			}
			wantCalls(t, o.exec, tt.want...)
		})
	}
}

const (
	gpu0 = "GPU-5f1c0a2e-1111-4222-8333-944455556666"
	gpu1 = "GPU-9a02bc3d-aaaa-4bbb-8ccc-dddddddddddd"
)

// TestGPUReset: only a GPU nvidia-smi lists on this host is reset, by the
// UUID nvidia-smi printed; anything else is refused with nothing run but
// the query.
func TestGPUReset(t *testing.T) {
	query := "nvidia-smi --query-gpu=uuid --format=csv,noheader"
	tests := []struct {
		name      string
		gpu       string
		list      string // what the query prints
		listErr   error
		resetErr  error
		fakeHW    bool
		wantErr   string
		retryable bool
		want      []string
	}{
		{name: "a GPU of this host", gpu: gpu1, list: gpu0 + "\n" + gpu1 + "\n",
			want: []string{query, "nvidia-smi --gpu-reset -i " + gpu1}},
		{name: "upper case asks for the listed GPU", gpu: strings.ToUpper(gpu1[:4]) + strings.ToUpper(gpu1[4:]), list: gpu0 + "\n" + gpu1 + "\n",
			want: []string{query, "nvidia-smi --gpu-reset -i " + gpu1}},
		{name: "another host's GPU", gpu: "GPU-00000000-0000-4000-8000-000000000000", list: gpu0 + "\n",
			wantErr: "is not a GPU of this host (nvidia-smi lists 1)", want: []string{query}},
		{name: "no nvidia-smi", gpu: gpu0, listErr: errNoSMI, wantErr: "nvidia-smi is not installed"},
		{name: "nvidia-smi fails", gpu: gpu0, listErr: errors.New("nvidia-smi --query-gpu=uuid = exit status 9: NVIDIA-SMI has failed"),
			wantErr: "NVIDIA-SMI has failed", retryable: true},
		{name: "output that is not UUIDs", gpu: gpu0, list: gpu0 + "\nNo devices were found\n",
			wantErr: `printed "No devices were found"`, retryable: true, want: []string{query}},
		{name: "reset fails", gpu: gpu0, list: gpu0 + "\n", resetErr: errors.New("nvidia-smi --gpu-reset = exit status 255: In use by another client"),
			wantErr: "In use by another client", retryable: true, want: []string{query, "nvidia-smi --gpu-reset -i " + gpu0}},
		{name: "fakehw: a GPU of the fake machine only logs", gpu: gpu1, fakeHW: true},
		{name: "fakehw: another GPU", gpu: "GPU-00000000-0000-4000-8000-000000000000", fakeHW: true, wantErr: "is not a GPU of this host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOpServer(t, func(s *seams, e *execLog) {
				s.fakeHW = tt.fakeHW
				s.fakeGPUs = func() []string { return []string{gpu0, gpu1} }
				s.smi = func(_ context.Context, args ...string) ([]byte, error) {
					if tt.listErr != nil {
						return nil, tt.listErr
					}
					e.add("nvidia-smi", args)
					if args[0] == "--gpu-reset" {
						return nil, tt.resetErr
					}
					return []byte(tt.list), nil
				}
			})
			r := o.call(t, `{"v":1,"op":"gpu.reset","gpu":"`+tt.gpu+`"}`)
			if tt.wantErr == "" {
				wantOK(t, r)
			} else {
				wantFailed(t, r, tt.wantErr, tt.retryable)
			}
			wantCalls(t, o.exec, tt.want...)
			ops := o.logs.lines(t, "helper: operation")
			if len(ops) != 1 || ops[0]["gpu"] != tt.gpu || ops[0]["pid"] != float64(7) {
				t.Errorf("logged %v", ops)
			}
		})
	}
}

func TestParseGPUList(t *testing.T) {
	got, err := parseGPUList([]byte(" " + gpu0 + " \n\n" + gpu1 + "\r\n"))
	if err != nil || !reflect.DeepEqual(got, []string{gpu0, gpu1}) {
		t.Errorf("parseGPUList = %v, %v", got, err)
	}
	if got, err := parseGPUList(nil); err != nil || len(got) != 0 {
		t.Errorf("no output: %v, %v", got, err)
	}
	for _, bad := range []string{"GPU-x\n", gpu0 + ", 0\n", "00000000:18:00.0\n", strings.Repeat(gpu0+"\n", maxGPUs+1)} {
		if got, err := parseGPUList([]byte(bad)); err == nil {
			t.Errorf("parseGPUList(%.40q) = %v, want an error", bad, got)
		}
	}
}

// FuzzGPUList: the parser of nvidia-smi's UUID list never panics and
// returns only GPU UUIDs.
func FuzzGPUList(f *testing.F) {
	f.Add([]byte(gpu0 + "\n" + gpu1 + "\n"))
	f.Add([]byte("No devices were found\n"))
	f.Add([]byte("\n \r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		gpus, err := parseGPUList(b)
		if err != nil {
			return
		}
		if len(gpus) > maxGPUs {
			t.Fatalf("%d GPUs", len(gpus))
		}
		for _, g := range gpus {
			if !wire.IsGPUUUID(g) {
				t.Fatalf("returned %q", g)
			}
		}
	})
}

// sliceServer is an opServer whose unit root has /run/systemd/system (a
// host systemd runs), whose fake systemctl keeps the slice active from
// start to stop, and whose cgroup tree holds bcd-alloc-a1.slice's cgroup
// with cgroup.events populated (when not nil).
func sliceServer(t *testing.T, populated *string) *opServer {
	t.Helper()
	var cg string
	o := newOpServer(t, func(s *seams, e *execLog) {
		cg = s.cgroup
		active := false
		s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
			e.add("systemctl", args)
			switch args[0] {
			case "show":
				if active {
					return []byte("active\n"), nil
				}
				return []byte("inactive\n"), nil
			case "start":
				active = true
			case "stop":
				active = false
			}
			return nil, nil
		}
	})
	mkdirs(t, o.root, "run/systemd/system")
	dir := filepath.Join(cg, "bcd.slice/bcd-alloc.slice/bcd-alloc-a1.slice")
	must(t, os.MkdirAll(dir, 0o755))
	if populated != nil {
		must(t, os.WriteFile(filepath.Join(dir, "cgroup.events"), []byte(*populated), 0o644))
	}
	return o
}

// TestSliceApplyAndRemove: apply writes the drop-in (0644, root's, only
// the lists given), reloads systemd and starts the slice; a second apply
// replaces it; remove refuses while the slice has processes, then stops
// it, removes the drop-in and its directory and reloads; a second remove
// is absent.
func TestSliceApplyAndRemove(t *testing.T) {
	events := "populated 1\nfrozen 0\n"
	o := sliceServer(t, &events)
	cgroupEvents := filepath.Join(o.srv.s.cgroup, "bcd.slice/bcd-alloc.slice/bcd-alloc-a1.slice/cgroup.events")
	dropin := filepath.Join(o.root, "run/systemd/system/bcd-alloc-a1.slice.d/50-bcd.conf")

	wantOK(t, o.call(t, `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0-1,3","mems":"0"}`))
	assertFile(t, dropin, []byte("# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\nAllowedCPUs=0-1,3\nAllowedMemoryNodes=0\n"), 0o644)
	wantCalls(t, o.exec, "systemctl daemon-reload", "systemctl start bcd-alloc-a1.slice")

	wantOK(t, o.call(t, `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"2"}`))
	assertFile(t, dropin, []byte("# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\nAllowedCPUs=2\n"), 0o644)
	wantCalls(t, o.exec, "systemctl daemon-reload", "systemctl start bcd-alloc-a1.slice")

	// Still running a process: refused, retryable, nothing run or removed.
	before := snapshot(t, o.root)
	wantFailed(t, o.call(t, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`), "still has processes; it is stopped only once empty", true)
	sameSnapshot(t, before, snapshot(t, o.root))
	wantCalls(t, o.exec)

	// Empty: the active slice is stopped, its drop-in removed, systemd
	// reloaded.
	must(t, os.WriteFile(cgroupEvents, []byte("populated 0\nfrozen 0\n"), 0o644))
	wantOK(t, o.call(t, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`))
	if _, err := os.Lstat(filepath.Dir(dropin)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the drop-in's directory after slice.remove: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(o.root, "run/systemd/system")); err != nil {
		t.Errorf("slice.remove removed more than its drop-in: %v", err)
	}
	wantCalls(t, o.exec, "systemctl show --property=ActiveState --value bcd-alloc-a1.slice",
		"systemctl stop bcd-alloc-a1.slice", "systemctl daemon-reload")

	// Gone: success, logged absent; an inactive slice is not stopped.
	wantOK(t, o.call(t, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`))
	wantCalls(t, o.exec, "systemctl show --property=ActiveState --value bcd-alloc-a1.slice")
	ops := o.logs.lines(t, "helper: operation")
	if len(ops) != 5 || ops[0]["slice"] != "bcd-alloc-a1.slice" || ops[0]["cpus"] != "0-1,3" || ops[0]["mems"] != "0" ||
		ops[2]["outcome"] != "refused" || ops[3]["outcome"] != "ok" || ops[4]["outcome"] != "absent" {
		t.Errorf("logged %v", ops)
	}
}

// TestSliceRefusalsChangeNothing: each refused slice request leaves the
// unit directory as it was and runs nothing.
func TestSliceRefusalsChangeNothing(t *testing.T) {
	o := sliceServer(t, nil)
	outside := filepath.Join(t.TempDir(), "elsewhere")
	must(t, os.Mkdir(outside, 0o755))
	must(t, os.Symlink(outside, filepath.Join(o.root, "run/systemd/system/bcd-alloc-planted.slice.d")))
	must(t, os.Mkdir(filepath.Join(o.root, "run/systemd/system/bcd-alloc-open.slice.d"), 0o755))
	must(t, os.Chmod(filepath.Join(o.root, "run/systemd/system/bcd-alloc-open.slice.d"), 0o777))
	tests := []struct{ name, req, wantErr string }{
		{"a CPU the host does not have", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"2-4"}`, "CPU 4 is not one of this host's online CPUs (0-3)"},
		{"a memory node the host does not have", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0","mems":"1"}`, "memory node 1 is not one of this host's memory nodes (0)"},
		{"a cpulist out of order", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"3,1"}`, "items must go up"},
		{"a cpulist with a stride", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0-3:2"}`, "not a cpulist"},
		{"a cpulist with a newline", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0\nExecStart=/bin/sh"}`, "not a cpulist"},
		{"neither cpus nor mems", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice"}`, "no cpus, no mems and no memory_max"},
		{"another slice", `{"v":1,"op":"slice.apply","slice":"system.slice","cpus":"0"}`, "is not bcd-alloc-<id>.slice"},
		{"a path in the slice", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-../../etc.slice","cpus":"0"}`, "may hold only"},
		{"a unit that is not a slice", `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.service"}`, "is not bcd-alloc-<id>.slice"},
		{"an unknown field", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0","unit":"x"}`, `unknown field "unit"`},
		{"remove with cpus", `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice","cpus":"0"}`, "slice.remove takes no cpus"},
		{"a symlink planted as the drop-in directory", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-planted.slice","cpus":"0"}`, "bcd-alloc-planted.slice.d is a symlink"},
		{"remove through the planted symlink", `{"v":1,"op":"slice.remove","slice":"bcd-alloc-planted.slice"}`, "bcd-alloc-planted.slice.d is a symlink"},
		{"a drop-in directory others can write", `{"v":1,"op":"slice.apply","slice":"bcd-alloc-open.slice","cpus":"0"}`, "can be written by group or others"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, o.root, outside)
			r := o.call(t, tt.req)
			if r.OK || !strings.Contains(r.Error, tt.wantErr) || r.Retryable {
				t.Errorf("answer %s, want a refusal containing %q", wire.EncodeResponse(r), tt.wantErr)
			}
			sameSnapshot(t, before, snapshot(t, o.root, outside))
			// Removing through the planted link may ask systemd the
			// slice's state first; nothing else runs.
			for _, c := range o.exec.take() {
				if !strings.HasPrefix(c, "systemctl show ") {
					t.Errorf("ran %s", c)
				}
			}
		})
	}
	for _, l := range o.logs.lines(t, "helper: operation") {
		if l["outcome"] != "refused" {
			t.Errorf("logged %v, want refused", l)
		}
	}
}

// TestSliceWithoutSystemd: on a host systemd does not run, slice.apply
// and slice.remove fail without creating /run/systemd/system.
func TestSliceWithoutSystemd(t *testing.T) {
	o := newOpServer(t, nil)
	before := snapshot(t, o.root)
	wantFailed(t, o.call(t, `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"0"}`), "systemd is not running on this host (no /run/systemd/system)", false)
	wantFailed(t, o.call(t, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`), "systemd is not running on this host", false)
	sameSnapshot(t, before, snapshot(t, o.root))
	wantCalls(t, o.exec)
}

// TestSliceFakeHW: a fakehw helper checks the lists against its machine
// and only logs.
func TestSliceFakeHW(t *testing.T) {
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.fakeHW = true
		s.topology = func() (string, string, error) { return "0-223", "0-1", nil }
	})
	before := snapshot(t, o.root)
	wantOK(t, o.call(t, `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"100-110","mems":"1"}`))
	wantFailed(t, o.call(t, `{"v":1,"op":"slice.apply","slice":"bcd-alloc-a1.slice","cpus":"224"}`), "CPU 224 is not one of this host's", false)
	wantOK(t, o.call(t, `{"v":1,"op":"slice.remove","slice":"bcd-alloc-a1.slice"}`))
	sameSnapshot(t, before, snapshot(t, o.root))
	wantCalls(t, o.exec)
	if n := len(o.logs.lines(t, "helper: slice.apply (a fakehw build only logs it)")); n != 1 {
		t.Errorf("%d fakehw slice.apply lines", n)
	}
}

func TestHostTopology(t *testing.T) {
	tests := []struct {
		name       string
		files      map[string]string
		cpus, mems string
	}{
		{"NUMA", map[string]string{"devices/system/cpu/online": "0-7\n", "devices/system/node/has_memory": "0-1\n", "devices/system/node/online": "0-2\n"}, "0-7", "0-1"},
		{"no has_memory", map[string]string{"devices/system/cpu/online": "0-1\n", "devices/system/node/online": "0\n"}, "0-1", "0"},
		{"no NUMA", map[string]string{"devices/system/cpu/online": "0\n"}, "0", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sys := t.TempDir()
			for f, v := range tt.files {
				must(t, os.MkdirAll(filepath.Dir(filepath.Join(sys, f)), 0o755))
				must(t, os.WriteFile(filepath.Join(sys, f), []byte(v), 0o644))
			}
			cpus, mems, err := hostTopology(sys)
			if err != nil || cpus != tt.cpus || mems != tt.mems {
				t.Errorf("hostTopology = %q %q %v, want %q %q", cpus, mems, err, tt.cpus, tt.mems)
			}
		})
	}
	if _, _, err := hostTopology(t.TempDir()); err == nil {
		t.Error("no cpu/online: no error")
	}
	// This host's own sysfs parses as cpulists.
	cpus, mems, err := hostTopology("/sys")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ParseCPUList(cpus); err != nil {
		t.Errorf("this host's CPUs %q: %v", cpus, err)
	}
	if _, err := wire.ParseCPUList(mems); err != nil {
		t.Errorf("this host's memory nodes %q: %v", mems, err)
	}
}

func TestSliceCgroup(t *testing.T) {
	for slice, want := range map[string]string{
		"bcd-alloc-a1.slice":  "bcd.slice/bcd-alloc.slice/bcd-alloc-a1.slice",
		"bcd-alloc-a-b.slice": "bcd.slice/bcd-alloc.slice/bcd-alloc-a.slice/bcd-alloc-a-b.slice",
	} {
		if got := wire.SliceCgroup(slice); got != want {
			t.Errorf("sliceCgroup(%s) = %s, want %s", slice, got, want)
		}
	}
}

// TestSliceThroughTheSocket: the client's slice calls reach the helper and
// its refusals come back as errors.
func TestSliceThroughTheSocket(t *testing.T) {
	testenv.NeedRoot(t, "a host (not fakehw) helper on the socket; TestSliceApplyAndRemove covers the operations")
	var mu sync.Mutex
	var calls []string
	h := startHelper(t, func(_ *Config, s *seams) {
		s.fakeHW = false
		s.systemctl = func(_ context.Context, args ...string) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, strings.Join(args, " "))
			return []byte("inactive\n"), nil
		}
	})
	mkdirs(t, h.root, "run/systemd/system")
	ctx := context.Background()
	if err := h.client.ApplySlice(ctx, "a1", "0-1", "0", 0); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(h.root, "run/systemd/system/bcd-alloc-a1.slice.d/50-bcd.conf"),
		[]byte("# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\nAllowedCPUs=0-1\nAllowedMemoryNodes=0\n"), 0o644)
	// memory_max alone, through the socket's strict decoder (issue 30:
	// the decoder refused the field the rest supports).
	if err := h.client.ApplySlice(ctx, "a1", "", "", 1<<30); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(h.root, "run/systemd/system/bcd-alloc-a1.slice.d/50-bcd.conf"),
		[]byte("# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\nMemoryMax=1073741824\n"), 0o644)
	err := h.client.ApplySlice(ctx, "a1", "0-9", "", 0)
	var herr *helperclient.Error
	if !errors.As(err, &herr) || !strings.Contains(herr.Msg, "CPU 4 is not one of this host's") {
		t.Fatalf("cpus beyond the host: %v", err)
	}
	if err := h.client.RemoveSlice(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(h.root, "run/systemd/system/bcd-alloc-a1.slice.d")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("drop-in directory after remove: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"daemon-reload", "start bcd-alloc-a1.slice", "daemon-reload", "start bcd-alloc-a1.slice", "show --property=ActiveState --value bcd-alloc-a1.slice", "daemon-reload"}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("systemctl calls %q, want %q", calls, want)
	}
}
