package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/fakeruntime"
	"github.com/better-compute/bcd/components/vm/qcow2"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// TestInstancesOnFakeRuntime: bcgw spec set puts two instances on a
// fakehw node; their qcow2 base comes from an https server on loopback
// through the image's SPKI pin. The node is killed (SIGKILL) while it
// sets them up and started again: it converges with one domain per
// instance, RUNNING and PAUSED, each disk an overlay of exactly the
// base. A domain defined by hand is never touched: an instance named
// like it fails alone. An empty section removes the domains, their
// directories and the image.
func TestInstancesOnFakeRuntime(t *testing.T) {
	l := newLab(t)
	digest, imageURL, pin := imageServer(t, l)
	image := `{"sha256":"` + digest + `","url":"` + imageURL + `","format":"qcow2","spki_pin":"` + pin + `"}`
	vm := func(id, state string) string {
		return `{"id":"` + id + `","allocation":"alloc_` + id + `","state":"` + state + `","vcpus":1,"memory_mib":128,"image":"` + digest + `"}`
	}

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	data := filepath.Join(filepath.Dir(cfg), "data")
	runtimeDir := filepath.Join(data, "fakehw", "runtime")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	// A domain defined by hand, which bcd must leave as it is.
	os.MkdirAll(runtimeDir, 0o700)
	foreign, _ := json.Marshal(fakeruntime.Record{Machine: vmruntime.Machine{ID: "byhand", VCPUs: 4, MemoryMiB: 4096}, State: vmruntime.Stopped})
	if err := os.WriteFile(filepath.Join(runtimeDir, "byhand.json"), foreign, 0o600); err != nil {
		t.Fatal(err)
	}

	gen := l.spec(g, "set", id, `{"instances":{"images":[`+image+`],"instances":[`+vm("vm-a", "RUNNING")+`,`+vm("vm-b", "PAUSED")+`]}}`)
	// Kill the node while it sets the instances up: once it has made the
	// first instance's directory, or fetched the image.
	end := time.Now().Add(30 * time.Second)
	for time.Now().Before(end) {
		if _, err := os.Stat(filepath.Join(data, "images", "tmp")); err == nil {
			if es, _ := os.ReadDir(filepath.Join(data, "images", "tmp")); len(es) > 0 {
				break
			}
		}
		if _, err := os.Stat(filepath.Join(data, "instances", "vm-a")); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	node.signal(syscall.SIGKILL)
	node.wait(t, 10*time.Second)
	l.start("bcd-node", "node", "--config", cfg)

	st := l.waitStatus(g, id, "instances converged", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == gen && section(s, "instances").State == "CONVERGED"
	})
	records := func() map[string]fakeruntime.Record {
		t.Helper()
		es, err := os.ReadDir(runtimeDir)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]fakeruntime.Record{}
		for _, e := range es {
			var r fakeruntime.Record
			b, _ := os.ReadFile(filepath.Join(runtimeDir, e.Name()))
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatalf("%s: %v", e.Name(), err)
			}
			m[strings.TrimSuffix(e.Name(), ".json")] = r
		}
		return m
	}
	r := records()
	var names []string
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "byhand vm-a vm-b" || r["vm-a"].State != "RUNNING" || r["vm-b"].State != "PAUSED" {
		t.Fatalf("domains after the kill and restart: %v %+v (status %+v)", names, r, section(st, "instances"))
	}
	for _, vmID := range []string{"vm-a", "vm-b"} {
		if _, err := qcow2.CheckFile(filepath.Join(data, "instances", vmID, "disk.qcow2"),
			qcow2.Backing{Path: filepath.Join(data, "images", digest+".qcow2"), Format: "qcow2"}); err != nil {
			t.Errorf("%s's disk: %v", vmID, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(runtimeDir, "byhand.json")); string(b) != string(foreign) {
		t.Errorf("the domain defined by hand changed: %s", b)
	}
	// bcgw instances lists every domain from the node's report.
	listed := func(want string) instancesList {
		t.Helper()
		var v instancesList
		end := time.Now().Add(30 * time.Second)
		for {
			json.Unmarshal([]byte(l.bcgw(g, "instances", id, "--json")), &v)
			if v.summary() == want || time.Now().After(end) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if v.summary() != want {
			t.Fatalf("bcgw instances: %s, want %s", v.summary(), want)
		}
		return v
	}
	listed("byhand STOPPED foreign; vm-a RUNNING bcd; vm-b PAUSED bcd; failed: ")
	if out := l.bcgw(g, "instances", id); !strings.Contains(out, "byhand") || !strings.Contains(out, "no (not touched)") {
		t.Errorf("bcgw instances:\n%s", out)
	}

	// bcgw instance: an instance named like the hand-made domain fails
	// alone; vm-b is removed and vm-a stopped, one generation each.
	instance := func(args ...string) uint64 {
		t.Helper()
		gen, err := strconv.ParseUint(strings.TrimSpace(l.bcgw(g, append([]string{"instance"}, args...)...)), 10, 64)
		if err != nil {
			t.Fatalf("bcgw instance %v: %v", args, err)
		}
		return gen
	}
	instance("remove", id, "--id", "vm-b")
	instance("add", id, "--id", "byhand", "--alloc", "alloc_x", "--image", digest+"="+imageURL,
		"--spki-pin", pin, "--memory-mib", "128")
	gen = instance("state", id, "--id", "vm-a", "--state", "STOPPED")
	st = l.waitStatus(g, id, "byhand failed", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == gen && section(s, "instances").State == "FAILED"
	})
	if m := section(st, "instances").Message; !strings.Contains(m, "1 of 2 instances failed: byhand: a domain bcd did not create") {
		t.Errorf("section message %q", m)
	}
	if r := records(); r["vm-a"].State != "STOPPED" || len(r) != 2 {
		t.Errorf("domains %+v: want vm-a STOPPED and byhand, vm-b removed", r)
	}
	if b, _ := os.ReadFile(filepath.Join(runtimeDir, "byhand.json")); string(b) != string(foreign) {
		t.Errorf("the domain defined by hand changed: %s", b)
	}
	listed("byhand STOPPED foreign; vm-a STOPPED bcd; failed: byhand")

	// Removing the last instances removes the section: every instance bcd
	// made goes, with its directory, and the image.
	instance("remove", id, "--id", "byhand")
	gen = instance("remove", id, "--id", "vm-a")
	if out := l.bcgw(g, "spec", "get", id); strings.Contains(out, `"instances"`) {
		t.Errorf("the spec still has an instances section:\n%s", out)
	}
	l.waitStatus(g, id, "instances removed", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == gen && section(s, "instances").State == "CONVERGED"
	})
	if r := records(); len(r) != 1 || r["byhand"].BCD != "" {
		t.Errorf("after removal: %+v; want byhand alone", r)
	}
	for _, p := range []string{filepath.Join(data, "instances", "vm-a"), filepath.Join(data, "images", digest+".qcow2")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want removed", p, err)
		}
	}
	listed("byhand STOPPED foreign; failed: ")
}

// imageServer serves a 64 MiB qcow2 base made by qemu-img over https on
// loopback, each download held 300 ms (room for a kill), and returns its
// SHA-256, URL and SPKI pin.
func imageServer(t *testing.T, l *lab) (digest, url, pin string) {
	t.Helper()
	qemuImg := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	p := filepath.Join(l.root, "base.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", p, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	base, _ := os.ReadFile(p)
	sum := sha256.Sum256(base)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		w.Write(base)
	}))
	t.Cleanup(srv.Close)
	return hex.EncodeToString(sum[:]), srv.URL + "/base.qcow2", pki.PinOfCert(srv.Certificate())
}

// TestInstanceGPUsBesideHolds: on a fakehw node, an instance asking for a
// GPU a hold has fails alone (resources-exhausted), one with a free GPU
// of the machine converges, and a hold then asking for that GPU fails
// alone (passed through to the instance): the devices and instances
// sections never share a GPU.
func TestInstanceGPUsBesideHolds(t *testing.T) {
	l := newLab(t)
	digest, imageURL, pin := imageServer(t, l)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	var st struct {
		GPUs []struct {
			UUID string `json:"uuid"`
		} `json:"gpus"`
	}
	_, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.GPUs) < 2 {
		t.Fatalf("bcd status: %v %s", err, out)
	}
	gpu0, gpu1 := st.GPUs[0].UUID, st.GPUs[1].UUID
	l.bcgw(g, "hold", id, "--alloc", "alloc_h", "--gpu", gpu1)
	add := func(vmID, gpu string) uint64 {
		gen, err := strconv.ParseUint(strings.TrimSpace(l.bcgw(g, "instance", "add", id, "--id", vmID, "--alloc", "alloc_"+vmID,
			"--image", digest+"="+imageURL, "--spki-pin", pin, "--memory-mib", "128", "--gpu", gpu)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return gen
	}
	add("vm-held", gpu1)
	gen := add("vm-free", gpu0)
	sv := l.waitStatus(g, id, "vm-held failed", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == gen && section(s, "instances").State == "FAILED"
	})
	if m := section(sv, "instances").Message; !strings.Contains(m, "1 of 2 instances failed: vm-held: resources-exhausted: GPU "+gpu1+" is held by alloc_h") {
		t.Fatalf("instances: %s", m)
	}
	if s := section(sv, "devices"); s.State != "CONVERGED" {
		t.Fatalf("devices: %+v", s)
	}
	gen, err := strconv.ParseUint(strings.TrimSpace(l.bcgw(g, "hold", id, "--alloc", "alloc_late", "--gpu", gpu0)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	sv = l.waitStatus(g, id, "alloc_late failed", func(s adminapi.StatusView) bool {
		return s.ObservedGeneration == gen && section(s, "devices").State == "FAILED"
	})
	if m := section(sv, "devices").Message; !strings.Contains(m, "alloc_late: resources-exhausted: GPU "+gpu0+" is passed through to instance vm-free") {
		t.Errorf("devices: %s", m)
	}
}

// instancesList is bcgw instances --json.
type instancesList struct {
	Complete bool `json:"complete"`
	Domains  []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Owned bool   `json:"owned"`
	} `json:"domains"`
	Failed map[string]string `json:"failed"`
}

// summary is "ID STATE bcd|foreign; ...; failed: ID ..." when complete.
func (v instancesList) summary() string {
	if !v.Complete {
		return "incomplete"
	}
	var parts []string
	for _, d := range v.Domains {
		who := "bcd"
		if !d.Owned {
			who = "foreign"
		}
		parts = append(parts, d.ID+" "+d.State+" "+who)
	}
	var failed []string
	for id := range v.Failed {
		failed = append(failed, id)
	}
	sort.Strings(failed)
	return strings.Join(parts, "; ") + "; failed: " + strings.Join(failed, " ")
}
