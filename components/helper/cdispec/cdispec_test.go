package cdispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

const (
	uuid0 = "GPU-5f1c0a2e-1111-4222-8333-944455556666"
	uuid1 = "GPU-9a02bc3d-aaaa-4bbb-8ccc-dddddddddddd"
	mig0  = "MIG-0a1b2c3d-0000-4000-8000-000000000001"
)

// hostNodes are the GPU device nodes of the checker's host in these tests.
var hostNodes = []string{"/dev/nvidia0", "/dev/nvidia1"}

func hostOK(p string) bool { return slices.Contains(hostNodes, p) }

// valid is the spec of allocation a1 holding both GPUs of the host.
func valid(t testing.TB) []byte {
	t.Helper()
	b, err := Render("a1", []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}, {UUID: uuid1, Node: "/dev/nvidia1"}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// edit decodes the valid spec, lets mod change it, and encodes it again.
func edit(t testing.TB, mod func(spec map[string]any, dev map[string]any, edits map[string]any)) []byte {
	t.Helper()
	var spec map[string]any
	if err := json.Unmarshal(valid(t), &spec); err != nil {
		t.Fatal(err)
	}
	dev := spec["devices"].([]any)[0].(map[string]any)
	mod(spec, dev, dev["containerEdits"].(map[string]any))
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRenderPassesCheck(t *testing.T) {
	tests := []struct {
		name  string
		alloc string
		gpus  []GPU
	}{
		{"one GPU", "a1", []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}}},
		{"two GPUs", "alloc_b-7", []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}, {UUID: uuid1, Node: "/dev/nvidia1"}}},
		{"a MIG device and its GPU's node once", "m", []GPU{{UUID: mig0, Node: "/dev/nvidia1"}, {UUID: uuid1, Node: "/dev/nvidia1"}}},
		{"the longest allocation", strings.Repeat("a", 128), []GPU{{UUID: uuid1, Node: "/dev/nvidia1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := Render(tt.alloc, tt.gpus)
			if err != nil {
				t.Fatal(err)
			}
			if err := Check(tt.alloc, spec, hostOK); err != nil {
				t.Errorf("Check of Render's spec: %v\n%s", err, spec)
			}
			// The CDI project's library (what podman and containerd load
			// specs with) loads and validates it as one device.
			p := filepath.Join(t.TempDir(), "bcd-"+tt.alloc+".json")
			if err := os.WriteFile(p, spec, 0o644); err != nil {
				t.Fatal(err)
			}
			if s, err := cdi.ReadSpec(p, 0); err != nil || len(s.Devices) != 1 || s.Devices[0].Name != tt.alloc {
				t.Errorf("cdi.ReadSpec of Render's spec: %v", err)
			}
			if err := CheckEnv(RenderEnv(tt.alloc, tt.gpus)); err != nil {
				t.Errorf("CheckEnv of RenderEnv's file: %v\n%s", err, RenderEnv(tt.alloc, tt.gpus))
			}
			// The same spec for another allocation is refused.
			if err := Check(tt.alloc+"x", spec, hostOK); err == nil {
				t.Error("the spec passed as another allocation's")
			}
		})
	}
}

func TestRenderRefuses(t *testing.T) {
	good := []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}}
	tests := []struct {
		name  string
		alloc string
		gpus  []GPU
	}{
		{"an empty allocation", "", good},
		{"an allocation with a path", "../x", good},
		{"an allocation starting with -", "-a", good},
		{"an allocation of 129", strings.Repeat("a", 129), good},
		{"no GPU", "a1", nil},
		{"a UUID that is not one", "a1", []GPU{{UUID: "GPU-x", Node: "/dev/nvidia0"}}},
		{"another device node", "a1", []GPU{{UUID: uuid0, Node: "/dev/sda"}}},
		{"a control device as the GPU", "a1", []GPU{{UUID: uuid0, Node: "/dev/nvidiactl"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := Render(tt.alloc, tt.gpus); err == nil {
				t.Errorf("Render = %s, want an error", b)
			}
		})
	}
}

func TestCheckRefuses(t *testing.T) {
	v := string(valid(t))
	tests := []struct {
		name     string
		alloc    string // "" means a1
		data     []byte
		deviceOK func(string) bool // nil means hostOK
		wantErr  string
	}{
		{name: "a hook", data: edit(t, func(_, _, e map[string]any) {
			e["hooks"] = []any{map[string]any{"hookName": "createContainer", "path": "/bin/sh", "args": []any{"sh", "-c", "touch /pwned"}}}
		}), wantErr: `unknown field "hooks"`},
		{name: "a hook at the top", data: edit(t, func(s, _, _ map[string]any) {
			s["containerEdits"] = map[string]any{"hooks": []any{map[string]any{"hookName": "createRuntime", "path": "/bin/sh"}}}
		}), wantErr: `unknown field "containerEdits"`},
		{name: "a mount", data: edit(t, func(_, _, e map[string]any) {
			e["mounts"] = []any{map[string]any{"hostPath": "/", "containerPath": "/host"}}
		}), wantErr: `unknown field "mounts"`},
		{name: "a device node with a host path", data: edit(t, func(_, _, e map[string]any) {
			e["deviceNodes"].([]any)[0].(map[string]any)["hostPath"] = "/dev/sda"
		}), wantErr: `unknown field "hostPath"`},
		{name: "a device node with numbers", data: edit(t, func(_, _, e map[string]any) {
			e["deviceNodes"].([]any)[0].(map[string]any)["major"] = 8
		}), wantErr: `unknown field "major"`},
		{name: "another device node", data: edit(t, func(_, _, e map[string]any) {
			e["deviceNodes"] = append(e["deviceNodes"].([]any), map[string]any{"path": "/dev/sda"})
		}), wantErr: `device node "/dev/sda" is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device`},
		{name: "a GPU the host does not have", data: edit(t, func(_, _, e map[string]any) {
			e["deviceNodes"].([]any)[1].(map[string]any)["path"] = "/dev/nvidia7"
		}), wantErr: `device node "/dev/nvidia7" is neither`},
		{name: "a GPU node with a leading zero", data: []byte(strings.Replace(v, `"/dev/nvidia1"`, `"/dev/nvidia01"`, 1)), wantErr: `"/dev/nvidia01" is neither`},
		{name: "no deviceOK", data: []byte(v), deviceOK: func(string) bool { return false }, wantErr: `"/dev/nvidia0" is neither`},
		{name: "only control devices", data: edit(t, func(_, _, e map[string]any) {
			e["deviceNodes"] = e["deviceNodes"].([]any)[2:]
		}), wantErr: "no GPU device node"},
		{name: "no device node", data: edit(t, func(_, _, e map[string]any) { e["deviceNodes"] = []any{} }), wantErr: "0 device nodes"},
		{name: "65 device nodes", data: edit(t, func(_, _, e map[string]any) {
			for len(e["deviceNodes"].([]any)) < 65 {
				e["deviceNodes"] = append(e["deviceNodes"].([]any), map[string]any{"path": "/dev/nvidia0"})
			}
		}), wantErr: "65 device nodes"},
		{name: "an extra top-level key", data: edit(t, func(s, _, _ map[string]any) { s["annotations"] = map[string]any{"x": "y"} }), wantErr: `unknown field "annotations"`},
		{name: "another version", data: edit(t, func(s, _, _ map[string]any) { s["cdiVersion"] = "0.7.0" }), wantErr: `cdiVersion "0.7.0", want 0.5.0`},
		{name: "another kind", data: edit(t, func(s, _, _ map[string]any) { s["kind"] = "nvidia.com/gpu" }), wantErr: `kind "nvidia.com/gpu", want bcd.dev/gpu`},
		{name: "a device named other than the allocation", data: edit(t, func(_, d, _ map[string]any) { d["name"] = "a2" }), wantErr: `device "a2" is not the allocation "a1"`},
		{name: "two devices", data: edit(t, func(s, d, _ map[string]any) {
			s["devices"] = []any{d, map[string]any{"name": "a1", "containerEdits": map[string]any{"deviceNodes": []any{map[string]any{"path": "/dev/nvidia1"}}}}}
		}), wantErr: "2 devices, want 1"},
		{name: "no device", data: edit(t, func(s, _, _ map[string]any) { s["devices"] = []any{} }), wantErr: "0 devices, want 1"},
		{name: "another variable", data: edit(t, func(_, _, e map[string]any) { e["env"] = append(e["env"].([]any), "LD_PRELOAD=x.so") }), wantErr: `variable "LD_PRELOAD" is not one bcd may set`},
		{name: "a variable twice", data: edit(t, func(_, _, e map[string]any) { e["env"] = append(e["env"].([]any), "BCD_ALLOCATION=a2") }), wantErr: "variable BCD_ALLOCATION is set twice"},
		{name: "a value with a space", data: edit(t, func(_, _, e map[string]any) { e["env"] = []any{"BCD_ALLOCATION=a 1"} }), wantErr: "the value of BCD_ALLOCATION has characters"},
		{name: "a value with a newline", data: edit(t, func(_, _, e map[string]any) { e["env"] = []any{"BCD_ALLOCATION=a1\nLD_PRELOAD=x"} }), wantErr: "the value of BCD_ALLOCATION has characters"},
		{name: "a value over 1 KiB", data: edit(t, func(_, _, e map[string]any) { e["env"] = []any{"BCD_ALLOCATION=" + strings.Repeat("a", 1025)} }), wantErr: "over 1 KiB"},
		{name: "an env entry without =", data: edit(t, func(_, _, e map[string]any) { e["env"] = []any{"BCD_ALLOCATION"} }), wantErr: "is not KEY=value"},
		// What one JSON reader reads one way and another another way.
		{name: "a key twice, the GPU last", data: []byte(strings.Replace(v, `"path": "/dev/nvidia0"`, `"path": "/dev/sda", "path": "/dev/nvidia0"`, 1)), wantErr: `key "path" is given twice in one object`},
		{name: "a key in another case, the GPU in it", data: []byte(strings.Replace(v, `"path": "/dev/nvidia0"`, `"path": "/dev/sda", "Path": "/dev/nvidia0"`, 1)), wantErr: `key "Path" is not spelt as the CDI specification spells it`},
		{name: "devices twice", data: []byte(strings.Replace(v, `"kind": "bcd.dev/gpu",`, `"kind": "bcd.dev/gpu", "devices": [{"name": "a1", "containerEdits": {"deviceNodes": [{"path": "/dev/sda"}]}}],`, 1)), wantErr: `key "devices" is given twice`},
		{name: "Devices", data: []byte(strings.Replace(v, `"devices"`, `"Devices"`, 1)), wantErr: `key "Devices" is not spelt`},
		{name: "data after the spec", data: []byte(v + "{}"), wantErr: "data after the JSON object"},
		{name: "two specs", data: []byte(v + v), wantErr: "data after the JSON object"},
		{name: "not JSON", data: []byte("cdiVersion: 0.6.0\n"), wantErr: "CDI spec: invalid character"},
		{name: "YAML that is not JSON", data: []byte("cdiVersion: \"0.6.0\"\nkind: bcd.dev/gpu\ndevices: []\n"), wantErr: "CDI spec: invalid character"},
		{name: "an array", data: []byte("[]"), wantErr: "CDI spec: json: cannot unmarshal array"},
		{name: "null", data: []byte("null"), wantErr: `cdiVersion ""`},
		{name: "empty", data: nil, wantErr: "EOF"},
		{name: "a number where a string belongs", data: []byte(strings.Replace(v, `"a1"`, `1`, 1)), wantErr: "cannot unmarshal number"},
		{name: "over 64 KiB", data: append(valid(t), bytes.Repeat([]byte(" "), MaxSpec)...), wantErr: "at most 65536"},
		{name: "a byte order mark", data: append([]byte("\xef\xbb\xbf"), valid(t)...), wantErr: "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			alloc, ok := tt.alloc, tt.deviceOK
			if alloc == "" {
				alloc = "a1"
			}
			if ok == nil {
				ok = hostOK
			}
			err := Check(alloc, tt.data, ok)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Check = %v, want an error containing %q\n%s", err, tt.wantErr, tt.data)
			}
		})
	}
	// A nil deviceOK allows no GPU.
	if err := Check("a1", []byte(v), nil); err == nil || !strings.Contains(err.Error(), "is neither") {
		t.Errorf("Check with nil deviceOK = %v", err)
	}
	// Whitespace and key order do not matter; escapes read alike by every
	// reader are allowed.
	compact := edit(t, func(map[string]any, map[string]any, map[string]any) {})
	if err := Check("a1", compact, hostOK); err != nil {
		t.Errorf("the spec compact and its keys sorted: %v\n%s", err, compact)
	}
	if err := Check("a1", []byte(strings.Replace(v, `"/dev/nvidia0"`, `"\/dev\/nvidia\u0030"`, 1)), hostOK); err != nil {
		t.Errorf("escapes: %v", err)
	}
}

func TestCheckEnv(t *testing.T) {
	good := string(RenderEnv("a1", []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}, {UUID: uuid1, Node: "/dev/nvidia1"}}))
	if good != "BCD_ALLOCATION=a1\nNVIDIA_VISIBLE_DEVICES="+uuid0+","+uuid1+"\nCUDA_VISIBLE_DEVICES="+uuid0+","+uuid1+"\n" {
		t.Fatalf("RenderEnv = %q", good)
	}
	for _, ok := range []string{good, "BCD_ALLOCATION=a1\n", "CUDA_VISIBLE_DEVICES=\n"} {
		if err := CheckEnv([]byte(ok)); err != nil {
			t.Errorf("CheckEnv(%q) = %v", ok, err)
		}
	}
	tests := []struct{ name, data, wantErr string }{
		{"another key", good + "LD_PRELOAD=/tmp/x.so\n", `variable "LD_PRELOAD" is not one bcd may set`},
		{"a key in another case", "bcd_allocation=a1\n", `variable "bcd_allocation" is not one`},
		{"export", "export BCD_ALLOCATION=a1\n", `variable "export BCD_ALLOCATION" is not one`},
		{"a line without =", good + "BCD_ALLOCATION\n", `"BCD_ALLOCATION" is not KEY=value`},
		{"a duplicate key", good + "BCD_ALLOCATION=a2\n", "variable BCD_ALLOCATION is set twice"},
		{"no final newline", strings.TrimSuffix(good, "\n"), "the last line has no newline"},
		{"empty", "", "the last line has no newline"},
		{"an empty line", "BCD_ALLOCATION=a1\n\nCUDA_VISIBLE_DEVICES=0\n", `"" is not KEY=value`},
		{"only a newline", "\n", `"" is not KEY=value`},
		{"CRLF", "BCD_ALLOCATION=a1\r\n", "the value of BCD_ALLOCATION has characters"},
		{"a quoted value", `BCD_ALLOCATION="a1"` + "\n", "the value of BCD_ALLOCATION has characters"},
		{"a command", "BCD_ALLOCATION=$(id)\n", "the value of BCD_ALLOCATION has characters"},
		{"a space before =", "BCD_ALLOCATION =a1\n", `variable "BCD_ALLOCATION " is not one`},
		{"a NUL", "BCD_ALLOCATION=a\x001\n", "has characters"},
		{"a value over 1 KiB", "BCD_ALLOCATION=" + strings.Repeat("a", 1025) + "\n", "over 1 KiB"},
		{"over 64 KiB", strings.Repeat("BCD_ALLOCATION=a1\n", MaxSpec/18+1), "at most 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckEnv([]byte(tt.data))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("CheckEnv(%.60q) = %v, want an error containing %q", tt.data, err, tt.wantErr)
			}
		})
	}
}

// jv is a JSON value as read token by token, every key of an object kept
// in order, duplicates and case included: what any JSON reader could read.
type jv struct {
	obj    []kv // an object (isObj)
	isObj  bool
	arr    []jv // an array (isArr)
	isArr  bool
	str    string
	isStr  bool
	scalar any // a number, bool or nil
}

type kv struct {
	key string
	val jv
}

func readJV(dec *json.Decoder) (jv, error) {
	tok, err := dec.Token()
	if err != nil {
		return jv{}, err
	}
	switch d := tok.(type) {
	case json.Delim:
		var v jv
		for dec.More() {
			if d == '{' {
				v.isObj = true
				k, err := dec.Token()
				if err != nil {
					return jv{}, err
				}
				val, err := readJV(dec)
				if err != nil {
					return jv{}, err
				}
				v.obj = append(v.obj, kv{k.(string), val})
			} else {
				v.isArr = true
				val, err := readJV(dec)
				if err != nil {
					return jv{}, err
				}
				v.arr = append(v.arr, val)
			}
		}
		v.isObj, v.isArr = d == '{', d == '['
		_, err := dec.Token()
		return v, err
	case string:
		return jv{str: d, isStr: true}, nil
	default:
		return jv{scalar: d}, nil
	}
}

// field is the one value of key in o: every key of o must be one of
// allowed, spelt exactly, and no two of o's keys may be equal in any
// case, so every reader, case-sensitive or not, first or last wins,
// reads the same field. ok is false when key is absent.
func field(o jv, key string, allowed ...string) (jv, bool, error) {
	if !o.isObj {
		return jv{}, false, errors.New("not an object")
	}
	var got jv
	found := false
	for i, p := range o.obj {
		if !slices.Contains(allowed, p.key) {
			return jv{}, false, fmt.Errorf("key %q", p.key)
		}
		for _, q := range o.obj[:i] {
			if strings.EqualFold(p.key, q.key) {
				return jv{}, false, fmt.Errorf("key %q and %q", q.key, p.key)
			}
		}
		if p.key == key {
			got, found = p.val, true
		}
	}
	return got, found, nil
}

// readsAs checks, reader-independently, that data is a spec of exactly
// one device named alloc whose every device node is a control device or
// one of hostNodes, and whose only edits are device nodes and
// environment.
func readsAs(data []byte, alloc string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	top, err := readJV(dec)
	if err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one value")
	}
	devs, ok, err := field(top, "devices", "cdiVersion", "kind", "devices")
	if err != nil || !ok || !devs.isArr || len(devs.arr) != 1 {
		return fmt.Errorf("devices %+v: %v", devs, err)
	}
	name, ok, err := field(devs.arr[0], "name", "name", "containerEdits")
	if err != nil || !ok || !name.isStr || name.str != alloc {
		return fmt.Errorf("device name %+v (want %q): %v", name, alloc, err)
	}
	edits, ok, err := field(devs.arr[0], "containerEdits", "name", "containerEdits")
	if err != nil || !ok {
		return fmt.Errorf("containerEdits: %v", err)
	}
	nodes, ok, err := field(edits, "deviceNodes", "env", "deviceNodes")
	if err != nil || !ok || !nodes.isArr {
		return fmt.Errorf("deviceNodes %+v: %v", nodes, err)
	}
	if _, _, err := field(edits, "env", "env", "deviceNodes"); err != nil {
		return err
	}
	for _, n := range nodes.arr {
		p, ok, err := field(n, "path", "path")
		if err != nil || !ok || !p.isStr || !slices.Contains(ControlDevices, p.str) && !slices.Contains(hostNodes, p.str) {
			return fmt.Errorf("device node %+v: %v", n, err)
		}
	}
	return nil
}

// loadsAs checks that the CDI project's own reader (YAML, what podman
// and containerd load specs with) reads data, if it reads it at all, as
// one device named alloc whose only edits are environment and device
// nodes by path alone, each a control device or one of hostNodes. (It
// may refuse what Check accepts, a "\/" escape for one: such a spec only
// fails to load.)
func loadsAs(data []byte, alloc string) error {
	raw, err := cdi.ParseSpec(data)
	if err != nil || raw == nil {
		return nil
	}
	if raw.Annotations != nil || !reflect.ValueOf(raw.ContainerEdits).IsZero() || len(raw.Devices) != 1 {
		return fmt.Errorf("read as %+v", raw)
	}
	d := raw.Devices[0]
	e := d.ContainerEdits
	if d.Name != alloc || d.Annotations != nil || e.Hooks != nil || e.Mounts != nil || e.NetDevices != nil || e.IntelRdt != nil || e.AdditionalGIDs != nil {
		return fmt.Errorf("read as device %+v", d)
	}
	for _, n := range e.DeviceNodes {
		if n == nil {
			continue // no device node
		}
		c := *n
		c.Path = ""
		if !reflect.ValueOf(c).IsZero() || !slices.Contains(ControlDevices, n.Path) && !slices.Contains(hostNodes, n.Path) {
			return fmt.Errorf("read a device node %+v", *n)
		}
	}
	return nil
}

// FuzzCheck: Check never panics, and whatever it accepts reads, in any
// JSON reader (keys in any case, first or last of a repeated key) and in
// the CDI project's own, as one device named after the allocation whose
// device nodes are all the host's GPUs or control devices, and nothing
// else.
func FuzzCheck(f *testing.F) {
	v := valid(f)
	f.Add("a1", v)
	one, _ := Render("a1", []GPU{{UUID: mig0, Node: "/dev/nvidia1"}})
	f.Add("a1", one)
	f.Add("a2", v)
	f.Add("a1", []byte(strings.Replace(string(v), `"path": "/dev/nvidia0"`, `"path": "/dev/sda", "Path": "/dev/nvidia0"`, 1)))
	f.Add("a1", []byte(strings.Replace(string(v), `"deviceNodes"`, `"hooks": [{"hookName": "createContainer", "path": "/bin/sh"}], "deviceNodes"`, 1)))
	f.Add("", []byte(`{"cdiVersion":"0.5.0","kind":"bcd.dev/gpu","devices":[{"name":"","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}]}`))
	f.Add("a1", []byte(`{"devices":null}`))
	f.Fuzz(func(t *testing.T, alloc string, data []byte) {
		if err := Check(alloc, data, hostOK); err != nil {
			return
		}
		if err := readsAs(data, alloc); err != nil {
			t.Fatalf("Check accepted a spec that does not read as allocation %q's alone: %v\n%s", alloc, err, data)
		}
		if err := loadsAs(data, alloc); err != nil {
			t.Fatalf("Check accepted a spec the CDI library reads otherwise: %v\n%s", err, data)
		}
	})
}

// FuzzCheckEnv: CheckEnv never panics, and whatever it accepts is lines of
// allow-listed KEY=value, each key once, the last line ended, no byte
// outside [A-Za-z0-9_,.:=-] but the newlines.
func FuzzCheckEnv(f *testing.F) {
	f.Add(RenderEnv("a1", []GPU{{UUID: uuid0, Node: "/dev/nvidia0"}}))
	f.Add([]byte("BCD_ALLOCATION=a1"))
	f.Add([]byte("LD_PRELOAD=/x.so\n"))
	f.Add([]byte("BCD_ALLOCATION=a1\nBCD_ALLOCATION=a2\n"))
	f.Add([]byte("\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := CheckEnv(data); err != nil {
			return
		}
		s := string(data)
		if !strings.HasSuffix(s, "\n") || len(data) > MaxSpec {
			t.Fatalf("accepted %q", data)
		}
		seen := map[string]bool{}
		for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
			k, v, ok := strings.Cut(l, "=")
			if !ok || !slices.Contains(EnvKeys, k) || seen[k] || len(v) > 1024 {
				t.Fatalf("accepted line %q of %q", l, data)
			}
			seen[k] = true
			for _, c := range []byte(v) {
				if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_,.:-", c) >= 0) {
					t.Fatalf("accepted byte %q in %q", c, l)
				}
			}
		}
	})
}
