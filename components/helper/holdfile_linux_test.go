//go:build linux

package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
)

// holdSpec is the CDI spec the node renders for allocation id holding the
// GPU at node (gpu0's UUID).
func holdSpec(t testing.TB, id, node string) []byte {
	t.Helper()
	b, err := cdispec.Render(id, []cdispec.GPU{{UUID: gpu0, Node: node}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// specEdit decodes holdSpec(id, /dev/nvidia0), lets mod change it and
// encodes it again.
func specEdit(t *testing.T, id string, mod func(spec, dev, edits map[string]any)) []byte {
	t.Helper()
	var spec map[string]any
	must(t, json.Unmarshal(holdSpec(t, id, "/dev/nvidia0"), &spec))
	dev := spec["devices"].([]any)[0].(map[string]any)
	mod(spec, dev, dev["containerEdits"].(map[string]any))
	b, err := json.Marshal(spec)
	must(t, err)
	return b
}

// fileWrite is a file.write request of kind and id with data.
func fileWrite(kind, id string, data []byte) string {
	return `{"v":1,"op":"file.write","kind":"` + kind + `","id":"` + id + `","data":"` + base64.StdEncoding.EncodeToString(data) + `"}`
}

// holdServer is an opServer whose host has GPUs /dev/nvidia0 and
// /dev/nvidia1, read (and counted) at each request.
func holdServer(t *testing.T) (*opServer, *int) {
	t.Helper()
	reads := 0
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.gpuMinors = func() ([]int, error) {
			reads++
			return []int{0, 1}, nil
		}
	})
	return o, &reads
}

// TestHoldFilesWritten: a CDI spec cdispec.Render made for a GPU of this
// host, and the environment file RenderEnv made, are written as sent; the
// host's GPUs are read at each CDI write, and only then.
func TestHoldFilesWritten(t *testing.T) {
	o, reads := holdServer(t)
	gpus := []cdispec.GPU{{UUID: gpu0, Node: "/dev/nvidia0"}, {UUID: gpu1, Node: "/dev/nvidia1"}}
	spec, err := cdispec.Render("alloc_a-1", gpus)
	must(t, err)
	wantOK(t, o.call(t, fileWrite("cdi", "alloc_a-1", spec)))
	assertFile(t, filepath.Join(o.root, "etc/cdi/bcd-alloc_a-1.json"), spec, 0o644)
	env := cdispec.RenderEnv("alloc_a-1", gpus)
	wantOK(t, o.call(t, fileWrite("allocation-env", "alloc_a-1", env)))
	assertFile(t, filepath.Join(o.root, "run/bcd-alloc/alloc_a-1.env"), env, 0o644)
	spec = holdSpec(t, "alloc_a-1", "/dev/nvidia1")
	wantOK(t, o.call(t, fileWrite("cdi", "alloc_a-1", spec)))
	assertFile(t, filepath.Join(o.root, "etc/cdi/bcd-alloc_a-1.json"), spec, 0o644)
	if *reads != 2 {
		t.Errorf("the host's GPUs were read %d times for 2 CDI writes and an environment file", *reads)
	}
	// A k8s-token file takes a kubeadm bootstrap token, with or without
	// its newline.
	wantOK(t, o.call(t, fileWrite("k8s-token", "", []byte("abcdef.0123456789abcdef"))))
	wantOK(t, o.call(t, fileWrite("k8s-token", "", []byte("abcdef.0123456789abcdef\n"))))
	// Removing takes no content and reads no GPU.
	wantOK(t, o.call(t, `{"v":1,"op":"file.remove","kind":"cdi","id":"alloc_a-1"}`))
	if *reads != 2 {
		t.Errorf("file.remove read the host's GPUs")
	}
}

// TestHoldFileRefusals: a CDI spec or environment file the checks refuse
// changes nothing on disk (no directory created either), answers a
// refusal naming what is wrong, and is logged as refused without the
// file's content.
func TestHoldFileRefusals(t *testing.T) {
	o, _ := holdServer(t)
	// A file of the same allocation already there stays as it was.
	must(t, os.MkdirAll(filepath.Join(o.root, "etc/cdi"), 0o755))
	must(t, os.WriteFile(filepath.Join(o.root, "etc/cdi/bcd-held.json"), holdSpec(t, "held", "/dev/nvidia0"), 0o644))
	valid := string(holdSpec(t, "a1", "/dev/nvidia0"))
	good := string(cdispec.RenderEnv("a1", []cdispec.GPU{{UUID: gpu0, Node: "/dev/nvidia0"}}))
	const marker = "touch /pwned-by-the-node" // content that must never be logged
	tests := []struct {
		name, kind, id string
		data           []byte
		wantErr        string
	}{
		{name: "a hook", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(_, _, e map[string]any) {
			e["hooks"] = []any{map[string]any{"hookName": "createContainer", "path": "/bin/sh", "args": []any{"sh", "-c", marker}}}
		}), wantErr: `file.write /etc/cdi/bcd-a1.json: CDI spec: json: unknown field \"hooks\"`},
		{name: "a mount", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(_, _, e map[string]any) {
			e["mounts"] = []any{map[string]any{"hostPath": "/", "containerPath": "/host", "options": []any{"rbind", marker}}}
		}), wantErr: `unknown field \"mounts\"`},
		{name: "a device node of another path", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(_, _, e map[string]any) {
			e["deviceNodes"] = append(e["deviceNodes"].([]any), map[string]any{"path": "/dev/sda"})
		}), wantErr: `device node \"/dev/sda\" is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device"`},
		{name: "a GPU minor this host does not have", kind: "cdi", id: "a1", data: holdSpec(t, "a1", "/dev/nvidia2"),
			wantErr: `device node \"/dev/nvidia2\" is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device (this host has the GPU device nodes /dev/nvidia0, /dev/nvidia1)`},
		{name: "an extra top-level key", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(s, _, _ map[string]any) {
			s["containerEdits"] = map[string]any{"env": []any{"BCD_ALLOCATION=a1"}}
		}), wantErr: `unknown field \"containerEdits\"`},
		{name: "a device named other than the id", kind: "cdi", id: "a1", data: holdSpec(t, "held", "/dev/nvidia0"),
			wantErr: `device \"held\" is not the allocation \"a1\"`},
		{name: "two devices", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(s, d, _ map[string]any) {
			s["devices"] = []any{d, map[string]any{"name": "a1", "containerEdits": map[string]any{"deviceNodes": []any{map[string]any{"path": "/dev/nvidia1"}}}}}
		}), wantErr: "2 devices, want 1"},
		{name: "a key twice, the host's GPU last", kind: "cdi", id: "a1",
			data:    []byte(strings.Replace(valid, `"path": "/dev/nvidia0"`, `"path": "/dev/sda", "path": "/dev/nvidia0"`, 1)),
			wantErr: `key \"path\" is given twice in one object`},
		{name: "a key in another case", kind: "cdi", id: "a1",
			data:    []byte(strings.Replace(valid, `"path": "/dev/nvidia0"`, `"path": "/dev/sda", "Path": "/dev/nvidia0"`, 1)),
			wantErr: `key \"Path\" is not spelt as the CDI specification spells it`},
		{name: "a spec over the held one", kind: "cdi", id: "held", data: holdSpec(t, "held", "/dev/nvidia9"), wantErr: `\"/dev/nvidia9\" is neither`},
		{name: "a long device path, cut", kind: "cdi", id: "a1", data: specEdit(t, "a1", func(_, _, e map[string]any) {
			e["deviceNodes"] = []any{map[string]any{"path": "/dev/" + strings.Repeat("x", 60<<10) + marker}}
		}), wantErr: `...`},
		{name: "an env file with another key", kind: "allocation-env", id: "a1", data: []byte(good + "LD_PRELOAD=x.so\n"),
			wantErr: `file.write /run/bcd-alloc/a1.env: environment file: variable \"LD_PRELOAD\" is not one bcd may set`},
		{name: "an env file with a line without =", kind: "allocation-env", id: "a1", data: []byte(good + "BCD_ALLOCATION\n"),
			wantErr: `environment file: \"BCD_ALLOCATION\" is not KEY=value`},
		{name: "an env file with a duplicate key", kind: "allocation-env", id: "a1", data: []byte(good + "BCD_ALLOCATION=a2\n"),
			wantErr: "environment file: variable BCD_ALLOCATION is set twice"},
		{name: "an env file without the final newline", kind: "allocation-env", id: "a1", data: []byte(strings.TrimSuffix(good, "\n")),
			wantErr: "environment file: the last line has no newline"},
		{name: "an env file with a command", kind: "allocation-env", id: "a1", data: []byte("BCD_ALLOCATION=$(" + marker + ")\n"),
			wantErr: "the value of BCD_ALLOCATION has characters"},
		// A k8s-token file lands in root's directory: only a kubeadm
		// bootstrap token is written (issue 30, finding 7).
		{name: "a k8s token that is a script", kind: "k8s-token", data: []byte("#!/bin/sh\n" + marker + "\n"),
			wantErr: "file.write /var/lib/bcd-hostconfig/k8s/bootstrap-token: 35 bytes: a k8s-token file holds one kubeadm bootstrap token"},
		{name: "a k8s token with a second line", kind: "k8s-token", data: []byte("abcdef.0123456789abcdef\nx\n"),
			wantErr: "a k8s-token file holds one kubeadm bootstrap token"},
		{name: "a k8s token in upper case", kind: "k8s-token", data: []byte("ABCDEF.0123456789abcdef"),
			wantErr: "byte 0 is not [a-z0-9]"},
		{name: "an empty k8s token", kind: "k8s-token", data: []byte{},
			wantErr: "0 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, o.root)
			r := o.call(t, fileWrite(tt.kind, tt.id, tt.data))
			if got := string(wire.EncodeResponse(r)); r.OK || r.Retryable || !strings.Contains(got, tt.wantErr) {
				t.Errorf("answer %s, want a refusal containing %s", got, tt.wantErr)
			}
			if len(wire.EncodeResponse(r)) > 1024 {
				t.Errorf("answer of %d bytes", len(wire.EncodeResponse(r)))
			}
			sameSnapshot(t, before, snapshot(t, o.root))
		})
	}
	if _, err := os.Lstat(filepath.Join(o.root, "run")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused environment file created its directory: %v", err)
	}
	ops := o.logs.lines(t, "helper: operation")
	if len(ops) != len(tests) {
		t.Fatalf("%d operations logged, want %d", len(ops), len(tests))
	}
	for i, l := range ops {
		if l["outcome"] != "refused" || l["op"] != "file.write" || l["kind"] != tests[i].kind || l["id"] != tests[i].id ||
			l["bytes"] != float64(len(tests[i].data)) || l["error"] == nil {
			t.Errorf("logged %v", l)
		}
	}
	if text := o.logs.String(); strings.Contains(text, marker) || strings.Contains(text, strings.Repeat("x", maxCheckError)) {
		t.Errorf("the log holds the refused files' content:\n%.2000s", text)
	}
}

// TestHoldFileInventory: the host's GPUs that cannot be read fail a CDI
// write (retryable) with nothing written; a host without a GPU refuses
// every spec and says so; environment files need no inventory.
func TestHoldFileInventory(t *testing.T) {
	var minors []int
	var readErr error
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.gpuMinors = func() ([]int, error) { return minors, readErr }
	})
	before := snapshot(t, o.root)
	readErr = errors.New("/proc/driver/nvidia/gpus/0000:18:00.0/information: no Device Minor line")
	wantFailed(t, o.call(t, fileWrite("cdi", "a1", holdSpec(t, "a1", "/dev/nvidia0"))),
		"file.write /etc/cdi/bcd-a1.json: reading this host's GPUs: /proc/driver/nvidia/gpus/0000:18:00.0/information: no Device Minor line", true)
	readErr = nil
	wantFailed(t, o.call(t, fileWrite("cdi", "a1", holdSpec(t, "a1", "/dev/nvidia0"))),
		`device node "/dev/nvidia0" is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device (this host has no NVIDIA GPU)`, false)
	sameSnapshot(t, before, snapshot(t, o.root))
	wantOK(t, o.call(t, fileWrite("allocation-env", "a1", []byte("BCD_ALLOCATION=a1\n"))))
	minors = []int{7}
	wantOK(t, o.call(t, fileWrite("cdi", "a1", holdSpec(t, "a1", "/dev/nvidia7"))))
	ops := o.logs.lines(t, "helper: operation")
	if len(ops) != 4 || ops[0]["outcome"] != "failed" || ops[1]["outcome"] != "refused" || ops[3]["outcome"] != "ok" {
		t.Errorf("logged %v", ops)
	}
}

// TestHoldFilesFakeMachine: a fakehw build's helper allows the device
// nodes of its fake machine's GPUs (helper.FakeMachine.Minors), handed in
// by the role's main, through the socket; a FakeMachine without Minors
// allows none.
func TestHoldFilesFakeMachine(t *testing.T) {
	fake := &FakeMachine{GPUs: func() []string { return nil }, Topology: func() (string, string, error) { return "0", "0", nil },
		Minors: func() []int { return []int{4, 5} }}
	h := startHelper(t, func(c *Config, _ *seams) { c.Fake = fake })
	ctx := context.Background()
	spec := holdSpec(t, "f1", "/dev/nvidia5")
	if err := h.client.WriteFile(ctx, "/etc/cdi/bcd-f1.json", spec); err != nil {
		t.Fatal(err)
	}
	assertFile(t, filepath.Join(h.root, "etc/cdi/bcd-f1.json"), spec, 0o644)
	err := h.client.WriteFile(ctx, "/etc/cdi/bcd-f2.json", holdSpec(t, "f2", "/dev/nvidia0"))
	var herr *helperclient.Error
	if !errors.As(err, &herr) || herr.Retryable || !strings.Contains(herr.Msg, "(this host has the GPU device nodes /dev/nvidia4, /dev/nvidia5)") {
		t.Fatalf("a GPU the fake machine lacks: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(h.root, "etc/cdi/bcd-f2.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the refused spec: %v", err)
	}

	noMinors := &FakeMachine{GPUs: fake.GPUs, Topology: fake.Topology}
	h2 := startHelper(t, func(c *Config, _ *seams) { c.Fake = noMinors })
	err = h2.client.WriteFile(ctx, "/etc/cdi/bcd-f1.json", spec)
	if !errors.As(err, &herr) || !strings.Contains(herr.Msg, "(this host has no NVIDIA GPU)") {
		t.Fatalf("a fake machine without Minors: %v", err)
	}
}

func TestHostGPUMinors(t *testing.T) {
	info := func(minor string) string {
		return "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 17\nGPU UUID: \t " + gpu0 + "\nVideo BIOS: \t 96.00.74.00.0d\n" +
			"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t 0000:18:00.0\n" +
			"Device Minor: \t " + minor + "\nGPU Excluded:\t No\n"
	}
	tests := []struct {
		name    string
		files   map[string]string // under driver/nvidia/gpus; "" a directory
		want    []int
		wantErr string
	}{
		{name: "no driver", files: nil, want: nil},
		{name: "no GPU", files: map[string]string{"": ""}, want: nil},
		{name: "two GPUs", files: map[string]string{"0000:18:00.0/information": info("0"), "0000:2a:00.0/information": info("1")}, want: []int{0, 1}},
		{name: "sorted, duplicates once", files: map[string]string{"0000:18:00.0/information": info("7"), "0000:2a:00.0/information": info("3"), "0000:3a:00.0/information": info("3")}, want: []int{3, 7}},
		{name: "a GPU gone since the listing", files: map[string]string{"0000:18:00.0/information": info("2"), "0000:2a:00.0/": ""}, want: []int{2}},
		{name: "254", files: map[string]string{"0000:18:00.0/information": info("254")}, want: []int{254}},
		{name: "255 is nvidiactl", files: map[string]string{"0000:18:00.0/information": info("255")}, wantErr: `Device Minor "255" is not a number of 0 to 254`},
		{name: "a leading zero", files: map[string]string{"0000:18:00.0/information": info("01")}, wantErr: `Device Minor "01"`},
		{name: "a sign", files: map[string]string{"0000:18:00.0/information": info("+1")}, wantErr: `Device Minor "+1"`},
		{name: "not a number", files: map[string]string{"0000:18:00.0/information": info("?")}, wantErr: `Device Minor "?"`},
		{name: "no minor", files: map[string]string{"0000:18:00.0/information": "Model: \t NVIDIA H100\n"}, wantErr: "0000:18:00.0/information: no Device Minor line"},
		{name: "two minors", files: map[string]string{"0000:18:00.0/information": info("0") + "Device Minor: \t 1\n"}, wantErr: "two Device Minor lines"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			proc := t.TempDir()
			for f, v := range tt.files {
				p := filepath.Join(proc, "driver/nvidia/gpus", f)
				if v == "" {
					must(t, os.MkdirAll(p, 0o755))
					continue
				}
				must(t, os.MkdirAll(filepath.Dir(p), 0o755))
				must(t, os.WriteFile(p, []byte(v), 0o444))
			}
			got, err := hostGPUMinors(proc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("hostGPUMinors = %v, %v, want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("hostGPUMinors = %v, %v, want %v", got, err, tt.want)
			}
		})
	}
	// This host's own /proc reads (no NVIDIA driver: no GPU).
	if _, err := hostGPUMinors("/proc"); err != nil {
		t.Errorf("this host's /proc: %v", err)
	}
}

// TestHoldFileMIG: a MIG instance's spec names its capability nodes; the
// helper allows the GPU and compute instance access nodes of its own GPUs
// from its own nvidia-caps table, and refuses those of another GPU, the
// config capability, and any capability on a host without the table.
func TestHoldFileMIG(t *testing.T) {
	caps, err := cdispec.ParseMIGCaps(cdispec.RenderMIGCaps())
	must(t, err)
	table := true
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.gpuMinors = func() ([]int, error) { return []int{0, 1}, nil }
		s.migCaps = func() (cdispec.MIGCaps, error) {
			if !table {
				return cdispec.MIGCaps{}, nil
			}
			return caps, nil
		}
	})
	mig := func(id string, gpu int, capNodes []string) []byte {
		b, err := cdispec.Render(id, []cdispec.GPU{{UUID: "MIG-11112222-3333-4444-5555-666677778888",
			Node: "/dev/nvidia" + string(rune('0'+gpu)), Caps: capNodes}})
		must(t, err)
		return b
	}
	own, _ := caps.Nodes(1, 2, 0)
	wantOK(t, o.call(t, fileWrite("cdi", "m1", mig("m1", 1, own))))
	other, _ := caps.Nodes(3, 2, 0)
	for name, data := range map[string][]byte{
		"another GPU's instance": mig("m2", 1, other),
		"the config capability":  mig("m2", 1, []string{cdispec.CapNode(1)}),
		"the monitor capability": mig("m2", 1, []string{cdispec.CapNode(2)}),
	} {
		if resp := o.call(t, fileWrite("cdi", "m2", data)); resp.OK || !strings.Contains(resp.Error, "capability") {
			t.Errorf("%s: answered %+v, want a refusal of the capability node", name, resp)
		}
	}
	table = false
	if resp := o.call(t, fileWrite("cdi", "m3", mig("m3", 1, own))); resp.OK || !strings.Contains(resp.Error, "capability") {
		t.Error("a capability node was written on a host without an nvidia-caps table")
	}
	for _, id := range []string{"m2", "m3"} {
		if _, err := os.Stat(filepath.Join(o.root, "etc/cdi/bcd-"+id+".json")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("refused spec %s is on disk: %v", id, err)
		}
	}
}

// TestHostMIGCaps reads the table from a proc tree; none there is empty.
func TestHostMIGCaps(t *testing.T) {
	proc := t.TempDir()
	if c, err := hostMIGCaps(proc); err != nil || len(c) != 0 {
		t.Errorf("no table: %v, %v", c, err)
	}
	must(t, os.MkdirAll(filepath.Join(proc, "driver/nvidia-caps"), 0o755))
	must(t, os.WriteFile(filepath.Join(proc, "driver/nvidia-caps/mig-minors"), cdispec.RenderMIGCaps(), 0o444))
	if c, err := hostMIGCaps(proc); err != nil || c["gpu0/gi0/access"] != 3 {
		t.Errorf("table: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(proc, "driver/nvidia-caps/mig-minors"), []byte("config one\n"), 0o444))
	if _, err := hostMIGCaps(proc); err == nil {
		t.Error("a malformed table gave no error")
	}
}
