package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// fileID is a file's inode and modification time.
func fileID(t *testing.T, p string) string {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d@%d", st.Sys().(*syscall.Stat_t).Ino, st.ModTime().UnixNano())
}

// TestGPUHolds: holds on a fakehw node write each hold's CDI spec (which
// the helper's own check accepts) and environment file; conflicts, a GPU
// that is not there and limits beyond the host fail alone while the rest
// converge; a held GPU is not reset; holds survive a kill of the node with
// bcgw down (files untouched); a released hold's files go.
func TestGPUHolds(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	root := filepath.Join(data, "fakehw", "root")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	var st struct {
		GPUs []struct {
			UUID   string `json:"uuid"`
			HeldBy string `json:"held_by"`
		} `json:"gpus"`
	}
	_, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.GPUs) < 3 {
		t.Fatalf("bcd status: %v %s", err, out)
	}
	gpu1 := st.GPUs[1].UUID
	spec := `{"devices":{"holds":[
		{"allocation":"alloc_a","gpus":["0"]},
		{"allocation":"alloc_b","gpus":["` + gpu1 + `"],"limits":{"cpus":"0-3","memory_bytes":1073741824}},
		{"allocation":"alloc_c","gpus":["0"]},
		{"allocation":"alloc_d","gpus":["99"]},
		{"allocation":"alloc_e","gpus":["2"],"limits":{"cpus":"0-4000"}}]}}`
	gen := l.spec(g, "set", id, spec)
	sv := l.waitStatus(g, id, "observed the holds", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	sec := section(sv, "devices")
	if sec.State != "FAILED" {
		t.Fatalf("devices: %+v", sec)
	}
	for _, want := range []string{"alloc_c: resources-exhausted: GPU", "held by alloc_a", "alloc_d: GPU 99 is not on this host", "alloc_e: resources-exhausted: CPU"} {
		if !strings.Contains(sec.Message, want) {
			t.Errorf("devices message lacks %q: %s", want, sec.Message)
		}
	}
	minors := map[string]bool{}
	for i := range 8 {
		minors[fmt.Sprintf("/dev/nvidia%d", i)] = true
	}
	for _, alloc := range []string{"alloc_a", "alloc_b"} {
		b, err := os.ReadFile(filepath.Join(root, "etc/cdi/bcd-"+alloc+".json"))
		if err != nil {
			t.Fatalf("%s: %v", alloc, err)
		}
		if err := cdispec.Check(alloc, b, func(p string) bool { return minors[p] }); err != nil {
			t.Errorf("%s: the helper's check refuses the spec the node wrote: %v", alloc, err)
		}
		env, err := os.ReadFile(filepath.Join(root, "run/bcd-alloc", alloc+".env"))
		if err != nil || cdispec.CheckEnv(env) != nil || !strings.Contains(string(env), "BCD_ALLOCATION="+alloc) {
			t.Errorf("%s env: %q %v", alloc, env, err)
		}
	}
	// The CDI project's own Go library (what podman resolves --device
	// with) reads the specs and lists exactly the bound holds.
	cdiDir := filepath.Join(root, "etc/cdi")
	cdiDevices := func() ([]string, map[string][]error) {
		c, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
		if err != nil {
			t.Fatal(err)
		}
		return c.ListDevices(), c.GetErrors()
	}
	if devs, errs := cdiDevices(); len(errs) != 0 || strings.Join(devs, " ") != "bcd.dev/gpu=alloc_a bcd.dev/gpu=alloc_b" {
		t.Errorf("CDI sees %v, errors %v", devs, errs)
	}
	for _, alloc := range []string{"alloc_c", "alloc_d", "alloc_e"} {
		if _, err := os.Stat(filepath.Join(root, "etc/cdi/bcd-"+alloc+".json")); err == nil {
			t.Errorf("a failed hold %s has a spec", alloc)
		}
	}
	_, out, _ = l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	json.Unmarshal([]byte(out), &st)
	if st.GPUs[0].HeldBy != "alloc_a" || st.GPUs[1].HeldBy != "alloc_b" || st.GPUs[2].HeldBy != "" {
		t.Errorf("held by: %+v", st.GPUs[:3])
	}
	if code, v := l.runKind(g, id, "gpu.reset", `{"gpu":"0"}`); code == 0 || !strings.Contains(v.Error, "hold") {
		t.Errorf("gpu.reset of a held GPU: exit %d %+v", code, v)
	}

	// Holds survive: the node killed and bcgw down, the node alone again
	// leaves the files as they were.
	specA := filepath.Join(root, "etc/cdi/bcd-alloc_a.json")
	before := fileID(t, specA)
	node.signal(syscall.SIGKILL)
	node.wait(t, 10*time.Second)
	g.signal(syscall.SIGTERM)
	g.wait(t, 15*time.Second)
	node = l.start("bcd-node", "node", "--config", cfg)
	end := time.Now().Add(20 * time.Second)
	var held string
	for time.Now().Before(end) {
		_, out, _ = l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
		if json.Unmarshal([]byte(out), &st) == nil && len(st.GPUs) > 0 && st.GPUs[0].HeldBy != "" {
			held = st.GPUs[0].HeldBy
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if held != "alloc_a" {
		t.Errorf("after a restart alone: GPU 0 held by %q", held)
	}
	time.Sleep(time.Second) // a pass has run
	if after := fileID(t, specA); after != before {
		t.Errorf("the spec of an unchanged hold was rewritten: %s, then %s", before, after)
	}

	// Release alloc_b: its files go.
	g = l.startGateway(gwDir, g.addr)
	l.waitNode(g, id, "connected again", func(n nodeView) bool { return n.Connected })
	// Drop the failed holds and release alloc_b with bcgw's sugar.
	l.spec(g, "set", id, `{"devices":{"holds":[{"allocation":"alloc_a","gpus":["0"]},{"allocation":"alloc_b","gpus":["`+gpu1+`"]}]}}`)
	gen, _ = strconv.ParseUint(strings.TrimSpace(l.bcgw(g, "release", id, "--alloc", "alloc_b")), 10, 64)
	sv = l.waitStatus(g, id, "the release", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	if s := section(sv, "devices"); s.State != "CONVERGED" {
		t.Errorf("devices after the release: %+v", s)
	}
	for _, p := range []string{"etc/cdi/bcd-alloc_b.json", "run/bcd-alloc/alloc_b.env"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s is still there after the release", p)
		}
	}
	if devs, errs := cdiDevices(); len(errs) != 0 || strings.Join(devs, " ") != "bcd.dev/gpu=alloc_a" {
		t.Errorf("after the release CDI sees %v, errors %v", devs, errs)
	}
	c, _ := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if _, err := c.InjectDevices(&oci.Spec{}, "bcd.dev/gpu=alloc_b"); err == nil || !strings.Contains(err.Error(), "unresolvable") {
		t.Errorf("a released hold still resolves: %v", err)
	}
	// The allocation events are node-signed.
	ag, err := identity.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(l.bcgw(g, "events", id, "--json")), "\n") {
		var e adminapi.EventView
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		types[e.Type]++
		if strings.HasPrefix(e.Type, "Allocation") {
			var se struct {
				Body          json.RawMessage `json:"body"`
				NodeSignature []byte          `json:"node_signature"`
			}
			if err := json.Unmarshal(e.Body, &se); err != nil || pki.Verify(ag.Cert.PublicKey, agent.PurposeEvent, agent.EventMessage(id, e.Type, se.Body), se.NodeSignature) != nil {
				t.Errorf("event %d %s is not node-signed: %v %s", e.Seq, e.Type, err, e.Body)
			}
		}
	}
	if types["AllocationBound"] != 2 || types["AllocationReleased"] != 1 || types["AllocationFailed"] < 3 {
		t.Errorf("events %v", types)
	}
}
