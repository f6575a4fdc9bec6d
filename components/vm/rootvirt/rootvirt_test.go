package rootvirt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/libvirttest"
	"github.com/better-compute/bcd/components/vm/seed"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// node is the uid the test's disk files belong to: the node account's.
const node = 4242

const gpuHere = "GPU-5f1c0a2b-0000-4000-8000-0123456789ab"

// env is one libvirtd and a node's data directory with a qcow2 base.
type env struct {
	d       *libvirttest.Daemon
	qemuImg string
	data    string
	base    string // the base image's digest
	host    helper.LibvirtHost
}

func newEnv(t *testing.T) *env {
	d := libvirttest.Start(t)
	e := &env{d: d, qemuImg: testenv.NeedTool(t, "qemu-img", "qemu-utils"), data: filepath.Join(d.Dir, "data")}
	for _, sub := range []string{"instances", "images"} {
		must(t, os.MkdirAll(filepath.Join(e.data, sub), 0o750))
	}
	tmp := filepath.Join(e.data, "images", "tmp.qcow2")
	e.run(t, "create", "-q", "-f", "qcow2", tmp, "64M")
	b, err := os.ReadFile(tmp)
	must(t, err)
	sum := sha256.Sum256(b)
	e.base = hex.EncodeToString(sum[:])
	must(t, os.Rename(tmp, e.basePath()))
	must(t, os.Chown(e.basePath(), node, node))
	e.host = helper.LibvirtHost{DataDir: e.data, Owner: node, Node: "node_one", Accel: libvirttest.Accel(), Staging: filepath.Join(d.Dir, "root-staging"),
		Virsh: func(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
			var out, errb bytes.Buffer
			cmd := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", d.URI()}, args...)...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
			if err := cmd.Run(); err != nil {
				return out.Bytes(), fmt.Errorf("virsh %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
			}
			return out.Bytes(), nil
		},
		GPUs: func(context.Context) (map[string]string, error) {
			return map[string]string{gpuHere: "00000000:3B:00.0"}, nil
		}}
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (e *env) basePath() string { return filepath.Join(e.data, "images", e.base+".qcow2") }

func (e *env) dir(id string) string { return filepath.Join(e.data, "instances", id) }

// run runs qemu-img with args. qemu-img times its LUKS key derivation by the thread's CPU time and
// gives up with "Unable to get accurate CPU usage" when that reads zero,
// which a machine under load makes happen now and then: such a run is
// tried again (up to 3 times), as it makes only the test's fixture.
func (e *env) run(t *testing.T, args ...string) {
	t.Helper()
	for try := 1; ; try++ {
		out, err := exec.Command(e.qemuImg, args...).CombinedOutput()
		if err == nil {
			return
		}
		if try < 3 && strings.Contains(string(out), "Unable to get accurate CPU usage") {
			t.Logf("qemu-img %v: %s (try %d, again)", args, bytes.TrimSpace(out), try)
			continue
		}
		t.Fatalf("qemu-img %v: %v\n%s", args, err, out)
	}
}

// instance makes id's directory as the node's converger does: an overlay
// of the base and a seed, the node's.
func (e *env) instance(t *testing.T, id string) {
	t.Helper()
	must(t, os.MkdirAll(e.dir(id), 0o750))
	e.run(t, "create", "-q", "-f", "qcow2", "-b", e.basePath(), "-F", "qcow2", filepath.Join(e.dir(id), vmruntime.DiskFile))
	must(t, seed.WriteFile(filepath.Join(e.dir(id), vmruntime.SeedFile), seed.Seed{InstanceID: id}))
	for _, f := range []string{"", vmruntime.DiskFile, vmruntime.SeedFile} {
		must(t, os.Chown(filepath.Join(e.dir(id), f), node, node))
	}
}

// section is a signed instances section naming ids over the base.
func (e *env) section(extra string, ids ...string) []byte {
	var ins []string
	for _, id := range ids {
		ins = append(ins, fmt.Sprintf(`{"id":%q,"allocation":"a","state":"RUNNING","vcpus":1,"memory_mib":64,"image":%q%s}`, id, e.base, extra))
	}
	return []byte(fmt.Sprintf(`{"images":[{"sha256":%q,"url":"https://img.example/b.qcow2","format":"qcow2"}],"instances":[%s]}`,
		e.base, strings.Join(ins, ",")))
}

func (e *env) virsh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.d.Virsh(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

func (e *env) domains(t *testing.T) string { return e.virsh(t, "list", "--all", "--name") }

// TestOnLibvirtd runs the operations on one real libvirtd
// (libvirttest), each subtest with instances of its own.
func TestOnLibvirtd(t *testing.T) {
	e := newEnv(t)
	t.Run("DefineAndAct", func(t *testing.T) { testDefineAndAct(t, e) })
	t.Run("Refusals", func(t *testing.T) { testRefusals(t, e) })
	t.Run("ForeignNeverTouched", func(t *testing.T) { testForeignNeverTouched(t, e) })
	t.Run("OtherNodesNeverTouched", func(t *testing.T) { testOtherNodesNeverTouched(t, e) })
	t.Run("StartChecksDisksAgain", func(t *testing.T) { testStartChecksDisksAgain(t, e) })
	t.Run("StartChecksTaps", func(t *testing.T) { testStartChecksTaps(t, e) })
	t.Run("SaveAndResume", func(t *testing.T) { testSaveAndResume(t, e) })
	t.Run("RestoredDisk", func(t *testing.T) { testRestoredDisk(t, e) })
	t.Run("MemoryRestore", func(t *testing.T) { testMemoryRestore(t, e) })
	t.Run("AttachIdentity", func(t *testing.T) { testAttachIdentity(t, e) })
}

// testDefineAndAct: a domain defined from the section, defined again
// (one domain, its UUID kept), run through every operation and removed.
func testDefineAndAct(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-a")
	if final, err := (Ops{}).Define(ctx, e.host, "vm-a", e.section("", "vm-a")); err != nil {
		t.Fatalf("Define = %v (final %v)", err, final)
	}
	uuid := e.virsh(t, "domuuid", "vm-a")
	if _, err := (Ops{}).Define(ctx, e.host, "vm-a", e.section("", "vm-a")); err != nil {
		t.Fatal(err)
	}
	if got := e.domains(t); got != "vm-a" {
		t.Fatalf("domains %q after two defines, want vm-a alone", got)
	}
	if got := e.virsh(t, "domuuid", "vm-a"); got != uuid {
		t.Errorf("uuid %s after defining again, was %s", got, uuid)
	}
	dump := e.virsh(t, "dumpxml", "vm-a")
	for _, want := range []string{"<domain type='" + e.host.Accel + "'", "<vcpu placement='static'>", "<memory unit='KiB'>65536</memory>",
		filepath.Join(e.dir("vm-a"), vmruntime.DiskFile), filepath.Join(e.dir("vm-a"), vmruntime.SeedFile)} {
		if !strings.Contains(dump, want) {
			t.Errorf("definition lacks %q:\n%s", want, dump)
		}
	}
	for _, step := range []struct{ op, state string }{
		{wire.OpLibvirtStart, "running"}, {wire.OpLibvirtSuspend, "paused"}, {wire.OpLibvirtResume, "running"},
		{wire.OpLibvirtDestroy, "shut off"}, {wire.OpLibvirtDestroy, "shut off"},
	} {
		if _, err := (Ops{}).Act(ctx, e.host, step.op, "vm-a"); err != nil {
			t.Fatalf("%s: %v", step.op, err)
		}
		if got := e.virsh(t, "domstate", "vm-a"); got != step.state {
			t.Fatalf("after %s: %q, want %q", step.op, got, step.state)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtUndefine, "vm-a"); err != nil {
			t.Fatalf("undefine #%d: %v", i+1, err)
		}
	}
	if got := e.domains(t); got != "" {
		t.Errorf("domains %q after undefine", got)
	}
	if final, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, "vm-a"); err == nil || !final || !strings.Contains(err.Error(), vmruntime.ErrNotFound.Error()) {
		t.Errorf("start of no domain = %v, %v; want a final not found", final, err)
	}
}

// testRefusals: each bad disk, GPU or domain is refused, final, with a
// line that says why, and no domain is defined.
func testRefusals(t *testing.T, e *env) {
	ctx := context.Background()
	other := filepath.Join(e.data, "elsewhere")
	must(t, os.MkdirAll(other, 0o750))
	overlay := func(t *testing.T, id string, args ...string) {
		disk := filepath.Join(e.dir(id), vmruntime.DiskFile)
		must(t, os.Remove(disk))
		e.run(t, append(append([]string{"create", "-q", "-f", "qcow2"}, args...), disk)...)
		must(t, os.Chown(disk, node, node))
	}
	for _, tt := range []struct {
		name, want string
		section    string // extra fields of the instance
		id         string // the id asked for, when not the instance's
		mod        func(t *testing.T, id string)
		guarded    func(ctx context.Context, tap string) error // the host's Guarded
	}{
		{name: "a tap without a network policy", want: "loads no network policy", section: nicSection},
		{name: "a tap the policy does not guard", want: "not guarded", section: nicSection, guarded: func(_ context.Context, tap string) error {
			return fmt.Errorf("tap %s is not guarded by the network policy root loaded", tap)
		}},
		{name: "backing /etc/shadow", want: `names backing file "/etc/shadow"`, mod: func(t *testing.T, id string) {
			overlay(t, id, "-u", "-b", "/etc/shadow", "-F", "raw", "-o", "size=64M")
		}},
		{name: "data file", want: "external data file", mod: func(t *testing.T, id string) {
			overlay(t, id, "-o", "data_file="+filepath.Join(other, id+".raw"), "-o", "size=64M")
		}},
		{name: "encryption", want: "encrypt", mod: func(t *testing.T, id string) {
			overlay(t, id, "--object", "secret,id=sec0,data=s3cr3t", "-o", "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=100", "-o", "size=64M")
		}},
		{name: "symlinked disk", want: "symlink", mod: func(t *testing.T, id string) {
			disk := filepath.Join(e.dir(id), vmruntime.DiskFile)
			must(t, os.Rename(disk, filepath.Join(other, id+".qcow2")))
			must(t, os.Symlink(filepath.Join(other, id+".qcow2"), disk))
		}},
		{name: "symlinked directory", want: "symlink", mod: func(t *testing.T, id string) {
			must(t, os.Rename(e.dir(id), filepath.Join(other, id)))
			must(t, os.Symlink(filepath.Join(other, id), e.dir(id)))
		}},
		{name: "hard-linked disk", want: "2 links", mod: func(t *testing.T, id string) {
			must(t, os.Link(filepath.Join(e.dir(id), vmruntime.DiskFile), filepath.Join(other, id+".qcow2")))
		}},
		{name: "root's disk", want: "belongs to uid 0", mod: func(t *testing.T, id string) {
			must(t, os.Chown(filepath.Join(e.dir(id), vmruntime.DiskFile), 0, 0))
		}},
		{name: "seed a directory", want: "not a regular file", mod: func(t *testing.T, id string) {
			seedPath := filepath.Join(e.dir(id), vmruntime.SeedFile)
			must(t, os.Remove(seedPath))
			must(t, os.Mkdir(seedPath, 0o750))
			must(t, os.Chown(seedPath, node, node))
		}},
		{name: "base names a backing file", want: "a base image may name none", mod: func(t *testing.T, id string) {
			b := e.basePath()
			must(t, os.Rename(b, b+".good"))
			t.Cleanup(func() { os.Remove(b); os.Rename(b+".good", b) })
			e.run(t, "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", b, "64M")
			must(t, os.Chown(b, node, node))
		}},
		{name: "GPU not on this host", want: "not on this host", section: `,"gpus":["GPU-00000000-1111-4000-8000-0123456789ab"]`},
		{name: "instance not in the section", want: "names no instance", id: "vm-other"},
		{name: "id out of the directory", want: "names no instance", id: "../../etc"},
		{name: "foreign domain", want: vmruntime.ErrForeign.Error(), mod: func(t *testing.T, id string) {
			xml := fmt.Sprintf(`<domain type="qemu"><name>%s</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`, id)
			p := filepath.Join(other, id+".xml")
			must(t, os.WriteFile(p, []byte(xml), 0o600))
			e.virsh(t, "define", p)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := strings.NewReplacer(" ", "-", "/", "", "'", "").Replace(tt.name)
			e.instance(t, id)
			if tt.mod != nil {
				tt.mod(t, id)
			}
			before := e.domains(t)
			ask := id
			if tt.id != "" {
				ask = tt.id
			}
			h := e.host
			h.Guarded = tt.guarded
			final, err := (Ops{}).Define(ctx, h, ask, e.section(tt.section, id))
			if err == nil || !final || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Define = %v, %v; want a final refusal containing %q", final, err, tt.want)
			}
			if after := e.domains(t); after != before {
				t.Fatalf("domains %q after the refusal, were %q", after, before)
			}
		})
	}
}

// nicSection is an instance's NIC, extra fields of the section.
const nicSection = `,"nics":[{"bridge":"br0","mac":"52:54:00:00:00:01","policy":"EGRESS"}]`

// testForeignNeverTouched: a domain defined by hand with virsh is
// refused by every operation and stays as it was.
func testForeignNeverTouched(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "byhand")
	xml := `<domain type="qemu"><name>byhand</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`
	p := filepath.Join(e.d.Dir, "byhand.xml")
	must(t, os.WriteFile(p, []byte(xml), 0o600))
	e.virsh(t, "define", p)
	e.virsh(t, "start", "byhand")
	before := e.virsh(t, "dumpxml", "--inactive", "byhand")
	for _, op := range []string{wire.OpLibvirtShutdown, wire.OpLibvirtDestroy, wire.OpLibvirtSuspend, wire.OpLibvirtResume, wire.OpLibvirtUndefine, wire.OpLibvirtStart} {
		if final, err := (Ops{}).Act(ctx, e.host, op, "byhand"); err == nil || !final || !strings.Contains(err.Error(), "never touched") {
			t.Errorf("%s = %v, %v; want a final refusal", op, final, err)
		}
	}
	if final, err := (Ops{}).Define(ctx, e.host, "byhand", e.section("", "byhand")); err == nil || !final {
		t.Errorf("Define over it = %v, %v; want a final refusal", final, err)
	}
	if got := e.virsh(t, "domstate", "byhand"); got != "running" {
		t.Errorf("the hand-made domain is %q", got)
	}
	if after := e.virsh(t, "dumpxml", "--inactive", "byhand"); after != before {
		t.Errorf("its definition changed:\n%s\nwas\n%s", after, before)
	}
}

// testOtherNodesNeverTouched: two nodes share one libvirtd. A domain
// root rendered for another node (its metadata names node_two) is
// refused to this node's root (node_one), final, for every operation and
// a define over it; it runs on, its definition unchanged. A domain whose
// metadata names no node (rendered before the metadata named one) is
// still this node's.
func testOtherNodesNeverTouched(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-o")
	two := e.host
	two.Node = "node_two"
	if _, err := (Ops{}).Define(ctx, two, "vm-o", e.section("", "vm-o")); err != nil {
		t.Fatal(err)
	}
	if _, err := (Ops{}).Act(ctx, two, wire.OpLibvirtStart, "vm-o"); err != nil {
		t.Fatal(err)
	}
	if got := e.virsh(t, "metadata", "vm-o", "--uri", domainxml.Namespace); got != `<instance id="vm-o" node="node_two"/>` {
		t.Errorf("metadata %q, want it to name node_two", got)
	}
	before := e.virsh(t, "dumpxml", "--inactive", "vm-o")
	for _, op := range []string{wire.OpLibvirtShutdown, wire.OpLibvirtDestroy, wire.OpLibvirtSuspend, wire.OpLibvirtResume, wire.OpLibvirtUndefine,
		wire.OpLibvirtStart, wire.OpLibvirtSave, wire.OpLibvirtAttachDisk} {
		if final, err := (Ops{}).Act(ctx, e.host, op, "vm-o"); err == nil || !final || !strings.Contains(err.Error(), "another node's") {
			t.Errorf("%s = %v, %v; want a final refusal", op, final, err)
		}
	}
	if final, err := (Ops{}).Define(ctx, e.host, "vm-o", e.section("", "vm-o")); err == nil || !final {
		t.Errorf("Define over it = %v, %v; want a final refusal", final, err)
	}
	if _, final, err := (Ops{}).Console(ctx, e.host, "vm-o"); err == nil || !final {
		t.Errorf("Console = %v, %v; want a final refusal", final, err)
	}
	if got := e.virsh(t, "domstate", "vm-o"); got != "running" {
		t.Errorf("node_two's domain is %q", got)
	}
	if after := e.virsh(t, "dumpxml", "--inactive", "vm-o"); after != before {
		t.Errorf("its definition changed:\n%s\nwas\n%s", after, before)
	}
	for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
		if _, err := (Ops{}).Act(ctx, two, op, "vm-o"); err != nil {
			t.Fatalf("node_two's %s: %v", op, err)
		}
	}
	// No root renders a domain for no node.
	none := e.host
	none.Node = ""
	if final, err := (Ops{}).Define(ctx, none, "vm-o", e.section("", "vm-o")); err == nil || !final || !strings.Contains(err.Error(), "bound to no node") {
		t.Errorf("Define for no node = %v, %v; want a final refusal", final, err)
	}

	xml := `<domain type="qemu"><name>vm-legacy</name><metadata><bcd:instance xmlns:bcd="` + domainxml.Namespace + `" id="vm-legacy"/></metadata>` +
		`<memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`
	p := filepath.Join(e.d.Dir, "legacy.xml")
	must(t, os.WriteFile(p, []byte(xml), 0o600))
	e.virsh(t, "define", p)
	if _, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtUndefine, "vm-legacy"); err != nil {
		t.Errorf("undefine of a domain naming no node: %v", err)
	}
	if got := e.domains(t); strings.Contains(got, "vm-legacy") {
		t.Errorf("domains %q after its undefine", got)
	}
}

// testStartChecksDisksAgain: a disk swapped for an overlay of
// /etc/shadow after the define is refused at start.
func testStartChecksDisksAgain(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-a")
	if _, err := (Ops{}).Define(ctx, e.host, "vm-a", e.section("", "vm-a")); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(e.dir("vm-a"), vmruntime.DiskFile)
	must(t, os.Remove(disk))
	e.run(t, "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", disk, "64M")
	must(t, os.Chown(disk, node, node))
	if final, err := (Ops{}).Act(ctx, e.host, wire.OpLibvirtStart, "vm-a"); err == nil || !final || !strings.Contains(err.Error(), "/etc/shadow") {
		t.Fatalf("start = %v, %v; want a final refusal naming /etc/shadow", final, err)
	}
	if got := e.virsh(t, "domstate", "vm-a"); got != "shut off" {
		t.Errorf("vm-a is %q", got)
	}
}

// testStartChecksTaps: a domain of bcd's with a tap starts only while
// the loaded network policy guards the tap.
func testStartChecksTaps(t *testing.T, e *env) {
	ctx := context.Background()
	e.instance(t, "vm-t")
	tap := "bcdt0123456789a0"
	xml := fmt.Sprintf(`<domain type="qemu"><name>vm-t</name><metadata><bcd:instance xmlns:bcd=%q id="vm-t"/></metadata>
<memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os><devices>
<interface type="bridge"><mac address="52:54:00:00:00:07"/><source bridge="br0"/><target dev=%q/></interface></devices></domain>`, domainxml.Namespace, tap)
	p := filepath.Join(e.d.Dir, "vm-t.xml")
	must(t, os.WriteFile(p, []byte(xml), 0o600))
	e.virsh(t, "define", p)
	var asked []string
	h := e.host
	h.Guarded = func(_ context.Context, name string) error {
		asked = append(asked, name)
		return fmt.Errorf("tap %s is not guarded by the network policy root loaded", name)
	}
	if final, err := (Ops{}).Act(ctx, h, wire.OpLibvirtStart, "vm-t"); err == nil || !final || !strings.Contains(err.Error(), "not guarded") {
		t.Fatalf("start = %v, %v; want a final refusal: not guarded", final, err)
	}
	if len(asked) != 1 || asked[0] != tap {
		t.Fatalf("asked about %v, want %s", asked, tap)
	}
	if got := e.virsh(t, "domstate", "vm-t"); got != "shut off" {
		t.Errorf("vm-t is %q", got)
	}
	h.Guarded = nil
	if final, err := (Ops{}).Act(ctx, h, wire.OpLibvirtStart, "vm-t"); err == nil || !final || !strings.Contains(err.Error(), "loads no network policy") {
		t.Fatalf("start without a policy = %v, %v", final, err)
	}
}

func TestParseBusID(t *testing.T) {
	for in, ok := range map[string]bool{"00000000:3B:00.0": true, "0000:01:1f.7": true, "0000:01:20.0": false, "0000:01:00": false, "x:01:00.0": false, "000000000:01:00.0": false} {
		if _, got := parseBusID(in); got != ok {
			t.Errorf("parseBusID(%q) ok = %v", in, got)
		}
	}
}
