// Package cdispec is the contract between the node, which renders a GPU
// hold's CDI spec and environment file, and bcd helper, which writes them
// as root and must trust nothing it is sent: Render and RenderEnv make the
// files, Check and CheckEnv decide, default-deny, whether content may be
// written at all.
//
// A spec is a Container Device Interface document of kind bcd.dev/gpu
// with one device, named after the allocation, whose container edits are
// only device nodes and environment variables: the device nodes must be
// the held GPUs' (a device path the checker's own host inventory allows)
// or the NVIDIA control devices, and the environment only allow-listed
// variables. Hooks, mounts, any other key or any other device are refused:
// a CDI hook runs as root in the container runtime. The environment file
// is KEY=value lines of the same allow-listed variables.
// docs/devices.md describes both files.
package cdispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Version is the CDI specification version written: the oldest that has
// everything a hold uses, so that older runtimes read it too (Debian 12's
// podman 4.3 reads specs up to 0.5.0 and calls a 0.6.0 one
// unresolvable).
const Version = "0.5.0"

// Kind is the CDI kind of a bcd GPU hold: --device bcd.dev/gpu=<allocation>.
const Kind = "bcd.dev/gpu"

// MaxSpec bounds a spec and an environment file.
const MaxSpec = 64 << 10

// ControlDevices are the NVIDIA devices every GPU container needs.
var ControlDevices = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// EnvKeys are the variables a spec or environment file may set: a slot
// hold on a GPU shared through MPS also gets its share of the GPU's
// threads.
var EnvKeys = []string{"BCD_ALLOCATION", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}

// Spec is the subset of a CDI spec bcd writes.
type Spec struct {
	CDIVersion string   `json:"cdiVersion"`
	Kind       string   `json:"kind"`
	Devices    []Device `json:"devices"`
}

// Device is one CDI device.
type Device struct {
	Name           string `json:"name"`
	ContainerEdits Edits  `json:"containerEdits"`
}

// Edits are a device's container edits: device nodes and environment.
type Edits struct {
	Env         []string     `json:"env,omitempty"`
	DeviceNodes []DeviceNode `json:"deviceNodes"`
}

// DeviceNode is a device node by path (the runtime reads its type and
// numbers from the host).
type DeviceNode struct {
	Path string `json:"path"`
}

// GPU is one held device: its UUID (GPU-... or MIG-...), its device
// node (/dev/nvidia<minor>, a MIG instance's parent GPU's) and, for a MIG
// instance, its capability device nodes (/dev/nvidia-caps/nvidia-cap<n>).
type GPU struct {
	UUID string
	Node string
	Caps []string
}

// The shapes below are checked by hand, not with regexp: bcd helper links
// this package and stays small.

func alnum(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }

// all reports whether every byte of s passes ok.
func all(s string, ok func(byte) bool) bool {
	for i := 0; i < len(s); i++ {
		if !ok(s[i]) {
			return false
		}
	}
	return true
}

// ValidAllocation reports whether id may name an allocation (a CDI device
// name and a file name): [A-Za-z0-9][A-Za-z0-9_-]{0,127}.
func ValidAllocation(id string) bool {
	return len(id) >= 1 && len(id) <= 128 && alnum(id[0]) && all(id, func(c byte) bool { return alnum(c) || c == '_' || c == '-' })
}

// validUUID is (GPU|MIG)-[0-9a-fA-F-]{8,64}.
func validUUID(u string) bool {
	rest, ok := strings.CutPrefix(u, "GPU-")
	if !ok {
		rest, ok = strings.CutPrefix(u, "MIG-")
	}
	return ok && len(rest) >= 8 && len(rest) <= 64 && all(rest, func(c byte) bool {
		return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' || c == '-'
	})
}

// gpuNode is /dev/nvidia[0-9]{1,3}.
func gpuNode(p string) bool {
	n, ok := strings.CutPrefix(p, "/dev/nvidia")
	return ok && len(n) >= 1 && len(n) <= 3 && all(n, func(c byte) bool { return '0' <= c && c <= '9' })
}

// validValue is [A-Za-z0-9_,.:-]{0,1024}.
func validValue(v string) bool {
	return len(v) <= 1024 && all(v, func(c byte) bool { return alnum(c) || strings.IndexByte("_,.:-", c) >= 0 })
}

// env is the environment of a hold, in EnvKeys order; extra are further
// KEY=value lines (a slot's MPS share).
func env(alloc string, gpus []GPU, extra []string) []string {
	var uuids []string
	for _, g := range gpus {
		if !slices.Contains(uuids, g.UUID) {
			uuids = append(uuids, g.UUID)
		}
	}
	list := strings.Join(uuids, ",")
	return append([]string{"BCD_ALLOCATION=" + alloc, "NVIDIA_VISIBLE_DEVICES=" + list, "CUDA_VISIBLE_DEVICES=" + list}, extra...)
}

// Render returns the CDI spec of a hold of gpus by allocation alloc;
// extra are environment lines beyond the GPU list (RenderEnv takes the
// same).
func Render(alloc string, gpus []GPU, extra ...string) ([]byte, error) {
	if !ValidAllocation(alloc) {
		return nil, fmt.Errorf("allocation %q is not [A-Za-z0-9_-], 1 to 128", alloc)
	}
	if len(gpus) == 0 {
		return nil, errors.New("a hold of no GPU")
	}
	var nodes []DeviceNode
	for _, g := range gpus {
		if !validUUID(g.UUID) || !gpuNode(g.Node) {
			return nil, fmt.Errorf("GPU %q at %q is not a GPU or MIG UUID with a /dev/nvidiaN node", g.UUID, g.Node)
		}
		for _, p := range append([]string{g.Node}, g.Caps...) {
			if p != g.Node && !capNode(p) {
				return nil, fmt.Errorf("GPU %q: %q is not an nvidia-caps device node", g.UUID, p)
			}
			if !slices.Contains(nodes, DeviceNode{Path: p}) {
				nodes = append(nodes, DeviceNode{Path: p})
			}
		}
	}
	seen := map[string]bool{}
	for _, l := range extra {
		if err := checkEnvLine(l, seen); err != nil {
			return nil, err
		}
	}
	for _, c := range ControlDevices {
		nodes = append(nodes, DeviceNode{Path: c})
	}
	b, err := json.MarshalIndent(Spec{CDIVersion: Version, Kind: Kind, Devices: []Device{{Name: alloc,
		ContainerEdits: Edits{Env: env(alloc, gpus, extra), DeviceNodes: nodes}}}}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// RenderEnv returns the environment file of a hold.
func RenderEnv(alloc string, gpus []GPU, extra ...string) []byte {
	return []byte(strings.Join(env(alloc, gpus, extra), "\n") + "\n")
}

// checkEnvLine checks one KEY=value of a spec or environment file.
func checkEnvLine(line string, seen map[string]bool) error {
	k, v, ok := strings.Cut(line, "=")
	switch {
	case !ok:
		return fmt.Errorf("%q is not KEY=value", line)
	case !slices.Contains(EnvKeys, k):
		return fmt.Errorf("variable %q is not one bcd may set (%s)", k, strings.Join(EnvKeys, ", "))
	case seen[k]:
		return fmt.Errorf("variable %s is set twice", k)
	case !validValue(v):
		return fmt.Errorf("the value of %s has characters other than [A-Za-z0-9_,.:-] or is over 1 KiB", k)
	}
	seen[k] = true
	return nil
}

// Check decides whether data may be written as the CDI spec of allocation
// alloc: the exact shape Render makes, one device named alloc, device
// nodes each either a control device or one deviceOK allows (the checker's
// own GPUs), allow-listed environment, nothing else.
func Check(alloc string, data []byte, deviceOK func(path string) bool) error {
	if !ValidAllocation(alloc) {
		return fmt.Errorf("CDI spec: %q is not an allocation ([A-Za-z0-9_-], 1 to 128, not starting with - or _)", alloc)
	}
	if len(data) > MaxSpec {
		return fmt.Errorf("CDI spec is %d bytes; at most %d", len(data), MaxSpec)
	}
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("CDI spec: %w (only cdiVersion, kind and devices with name, env and deviceNodes paths are allowed: no hooks, no mounts)", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("CDI spec: data after the JSON object")
	}
	if err := exactKeys(json.NewDecoder(bytes.NewReader(data))); err != nil {
		return fmt.Errorf("CDI spec: %w", err)
	}
	switch {
	case s.CDIVersion != Version:
		return fmt.Errorf("CDI spec: cdiVersion %q, want %s", s.CDIVersion, Version)
	case s.Kind != Kind:
		return fmt.Errorf("CDI spec: kind %q, want %s", s.Kind, Kind)
	case len(s.Devices) != 1:
		return fmt.Errorf("CDI spec: %d devices, want 1", len(s.Devices))
	case s.Devices[0].Name != alloc:
		return fmt.Errorf("CDI spec: device %q is not the allocation %q", s.Devices[0].Name, alloc)
	}
	e := s.Devices[0].ContainerEdits
	if len(e.DeviceNodes) == 0 || len(e.DeviceNodes) > 64 {
		return fmt.Errorf("CDI spec: %d device nodes", len(e.DeviceNodes))
	}
	gpus := 0
	for _, n := range e.DeviceNodes {
		switch {
		case slices.Contains(ControlDevices, n.Path):
		case gpuNode(n.Path) && deviceOK != nil && deviceOK(n.Path):
			gpus++
		case capNode(n.Path) && deviceOK != nil && deviceOK(n.Path):
		default:
			return fmt.Errorf("CDI spec: device node %q is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device", n.Path)
		}
	}
	if gpus == 0 {
		return errors.New("CDI spec: no GPU device node")
	}
	seen := map[string]bool{}
	for _, l := range e.Env {
		if err := checkEnvLine(l, seen); err != nil {
			return fmt.Errorf("CDI spec: %w", err)
		}
	}
	return nil
}

// specKeys are the keys of a spec, spelt as the CDI specification spells
// them.
var specKeys = map[string]bool{"cdiVersion": true, "kind": true, "devices": true, "name": true,
	"containerEdits": true, "env": true, "deviceNodes": true, "path": true}

// exactKeys reads the next JSON value of dec (one encoding/json has
// already decoded into a Spec, so it is well formed and shallow) and
// refuses what one JSON reader could read one way and another reader
// another: a key given twice in one object (encoding/json keeps the last,
// others the first or an error) or spelt in another case (encoding/json
// reads "Path" as path, a case-sensitive reader does not; a reader that
// re-encodes through a map may keep "path" after "Path"). What Check
// accepts is then read alike by every reader.
func exactKeys(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if d == '{' {
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return err
			}
			key, _ := tok.(string)
			switch {
			case !specKeys[key]:
				return fmt.Errorf("key %q is not spelt as the CDI specification spells it", key)
			case seen[key]:
				return fmt.Errorf("key %q is given twice in one object", key)
			}
			seen[key] = true
			if err := exactKeys(dec); err != nil {
				return err
			}
		}
	} else {
		for dec.More() {
			if err := exactKeys(dec); err != nil {
				return err
			}
		}
	}
	_, err = dec.Token() // the closing brace or bracket
	return err
}

// CheckEnv decides whether data may be written as a hold's environment
// file: KEY=value lines of EnvKeys only, each at most once.
func CheckEnv(data []byte) error {
	if len(data) > MaxSpec {
		return fmt.Errorf("environment file is %d bytes; at most %d", len(data), MaxSpec)
	}
	s := string(data)
	if !strings.HasSuffix(s, "\n") {
		return errors.New("environment file: the last line has no newline")
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if err := checkEnvLine(l, seen); err != nil {
			return fmt.Errorf("environment file: %w", err)
		}
	}
	return nil
}
