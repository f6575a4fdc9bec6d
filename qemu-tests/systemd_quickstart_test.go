package qemutests

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docs/quickstart.md is run by the systemd tier (stepQuickstart): every
// `sh` block of the page, in order, in the tier's guest, which plays
// every machine the page names. The page marks each block with the
// machine it runs on, `<!-- run: ROLE -->` on the line before its fence,
// and each file moved between machines with `<!-- copy: ROLE:PATH to
// ROLE:PATH -->`. An `sh` block without a marker is refused: every
// command on the page runs.

// quickstartRoles are the machines of the page.
var quickstartRoles = map[string]bool{"db": true, "gateway-1": true, "gateway-2": true, "balancer": true, "node": true}

// quickstartDir is where every machine's commands run in the guest (the
// page's "directory you run the commands in"), with the packages in it.
const quickstartDir = "/root/quickstart"

var (
	runMarker  = regexp.MustCompile(`^<!-- run: ([a-z0-9-]+) -->$`)
	copyMarker = regexp.MustCompile(`^<!-- copy: ([a-z0-9-]+):(\S+) to ([a-z0-9-]+):(\S+) -->$`)
)

// qsBlock is one step of the page: a shell block run on Role, or (From
// set) a copy of a file from one machine to another.
type qsBlock struct {
	Line   int // of the marker, 1-based
	Role   string
	Script string
	// A copy: each "ROLE:PATH", the path relative to quickstartDir
	// unless absolute.
	From, To string
}

func (b qsBlock) String() string {
	if b.From != "" {
		return fmt.Sprintf("docs/quickstart.md:%d: copy %s to %s", b.Line, b.From, b.To)
	}
	return fmt.Sprintf("docs/quickstart.md:%d (on %s):\n%s", b.Line, b.Role, b.Script)
}

// parseQuickstart reads the page's steps in order.
func parseQuickstart(page string) ([]qsBlock, error) {
	lines := strings.Split(page, "\n")
	var out []qsBlock
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := copyMarker.FindStringSubmatch(l); m != nil {
			if !quickstartRoles[m[1]] || !quickstartRoles[m[3]] {
				return nil, fmt.Errorf("line %d: a copy between unknown machines: %s", i+1, l)
			}
			out = append(out, qsBlock{Line: i + 1, From: m[1] + ":" + m[2], To: m[3] + ":" + m[4]})
			continue
		}
		m := runMarker.FindStringSubmatch(l)
		if m == nil {
			if strings.HasPrefix(l, "<!-- run:") || strings.HasPrefix(l, "<!-- copy:") {
				return nil, fmt.Errorf("line %d: a marker this test does not read: %s", i+1, l)
			}
			if strings.HasPrefix(l, "```sh") {
				return nil, fmt.Errorf("line %d: an sh block with no <!-- run: ROLE --> on the line before it (every command on the page runs)", i+1)
			}
			continue
		}
		if !quickstartRoles[m[1]] {
			return nil, fmt.Errorf("line %d: machine %q is none of the page's", i+1, m[1])
		}
		if i+1 >= len(lines) || lines[i+1] != "```sh" {
			return nil, fmt.Errorf("line %d: <!-- run: %s --> is not followed by a ```sh fence", i+1, m[1])
		}
		end := i + 2
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("line %d: the block never ends", i+2)
		}
		out = append(out, qsBlock{Line: i + 1, Role: m[1], Script: strings.Join(lines[i+2:end], "\n") + "\n"})
		i = end
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no <!-- run: ROLE --> block")
	}
	return out, nil
}

func readQuickstart(t *testing.T, repo string) []qsBlock {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "docs", "quickstart.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseQuickstart(string(b))
	if err != nil {
		t.Fatalf("docs/quickstart.md: %v", err)
	}
	return blocks
}

// The page's balancer: build/haproxy.cfg filled in with these.
var quickstartHAProxy = strings.NewReplacer("@MAXCONN@", "20000", "@BIND@", ":8443",
	"@SERVERS@", "    server gw1 gw1.example.net:8444 check port 9444\n    server gw2 gw2.example.net:8445 check port 9445")

// TestQuickstartPage (no guest): the page parses, every machine has its
// blocks, and the HAProxy configuration it writes is build/haproxy.cfg
// (the one the e2e tests and make demo-ha run) filled in, word for word
// but the file's own header comment.
func TestQuickstartPage(t *testing.T) {
	repo := repoRoot(t)
	blocks := readQuickstart(t, repo)
	seen := map[string]int{}
	for _, b := range blocks {
		seen[b.Role]++
	}
	for r := range quickstartRoles {
		if seen[r] == 0 {
			t.Errorf("docs/quickstart.md runs nothing on %s", r)
		}
	}
	tmpl, err := os.ReadFile(filepath.Join(repo, "build", "haproxy.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	_, want, ok := strings.Cut(quickstartHAProxy.Replace(string(tmpl)), "\nglobal\n")
	if !ok {
		t.Fatal("build/haproxy.cfg has no global section")
	}
	want = "global\n" + want
	const open = "cat > /etc/haproxy/haproxy.cfg <<'EOF'\n"
	found := false
	for _, b := range blocks {
		_, rest, ok := strings.Cut(b.Script, open)
		if !ok {
			continue
		}
		found = true
		got, _, _ := strings.Cut(rest, "\nEOF\n")
		if got+"\n" != want {
			t.Errorf("docs/quickstart.md:%d writes an haproxy.cfg that is not build/haproxy.cfg filled in; want:\n%s", b.Line, want)
		}
	}
	if !found {
		t.Errorf("docs/quickstart.md has no block with %q", open)
	}
}

func TestParseQuickstartRefuses(t *testing.T) {
	for name, page := range map[string]string{
		"sh block without a marker": "text\n```sh\necho hi\n```\n<!-- run: db -->\n```sh\ntrue\n```\n",
		"unknown machine":           "<!-- run: laptop -->\n```sh\ntrue\n```\n",
		"marker without a block":    "<!-- run: db -->\n\n```sh\ntrue\n```\n",
		"block never ends":          "<!-- run: db -->\n```sh\ntrue\n",
		"misspelt marker":           "<!-- run:db -->\n```sh\ntrue\n```\n",
		"copy to an unknown one":    "<!-- copy: db:x to laptop:x -->\n<!-- run: db -->\n```sh\ntrue\n```\n",
		"nothing to run":            "# a page\n",
	} {
		if _, err := parseQuickstart(page); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
	got, err := parseQuickstart("<!-- run: db -->\n```sh\nA=1\n```\n<!-- copy: db:f to node:/tmp/f -->\n```text\nout\n```\n")
	if err != nil || len(got) != 2 || got[0].Script != "A=1\n" || got[0].Role != "db" || got[1].From != "db:f" || got[1].To != "node:/tmp/f" {
		t.Errorf("parseQuickstart: %+v %v", got, err)
	}
}

// qsWrapper runs one block in bash as the page's reader would in a
// terminal on that machine: in quickstartDir, with the variables earlier
// blocks of the same machine set (kept in STATE between blocks), stopping
// at the first command that fails. @ROLE@, @STATE@ and @BLOCK@ are filled
// in.
const qsWrapper = `#!/bin/bash
cd ` + quickstartDir + `
__before=$(compgen -v)
if [ -f @STATE@ ]; then . @STATE@; fi
set -e
@BLOCK@
set +e
for __v in $(compgen -v); do
	case $__v in __* | BASH* | PIPESTATUS | FUNCNAME | GROUPS | DIRSTACK | _ | LINENO | RANDOM | SRANDOM | SECONDS | EPOCH* | OPTIND | OPTARG | COLUMNS | LINES | PWD | OLDPWD) continue ;; esac
	if ! grep -qx -- "$__v" <<<"$__before" || grep -q "^declare -[-a-zA-Z]* $__v=" @STATE@ 2>/dev/null; then
		declare -p "$__v"
	fi
done >@STATE@.new && mv @STATE@.new @STATE@
`

// qsHook checks something between the page's blocks: before or after
// the first block on Role whose text has Match.
type qsHook struct {
	Role, Match string
	Before      bool
	Check       func(t *testing.T)
	done        bool
}

// stepQuickstart runs docs/quickstart.md in the guest. What the page
// does not say, the test does first: the node and site agents of the
// earlier steps stop and forget who they were, the page's names point at the
// guest, the packages are where the page has them, a stand-in nvidia-smi
// plays two GPUs, and PostgreSQL and HAProxy (installed in the image,
// disabled there for the other steps) are enabled and started as their
// packages' install does on a host that did not have them, so the page's
// apt-get install of them finds what a fresh install leaves.
func stepQuickstart(t *testing.T, e *systemdEnv) {
	blocks := readQuickstart(t, e.repo)
	g := e.g
	start := time.Now()
	// The agents the earlier steps left stop, and their configuration and
	// identities go; their packages stay (a purge is 1-2 minutes of apt
	// under TCG): the page's apt-get install of bcd-node replaces a
	// bcd-site (they conflict) and finds a bcd-node installed.
	g.Must("systemctl stop bcd.service bcd-join.service bcd-helper.service bcd-site.service 2>/dev/null; rm -rf /etc/systemd/system/bcd.service.d /etc/bcd/* /var/lib/bcd /var/lib/bcd-site " + quickstartDir + " && mkdir -m 0700 " + quickstartDir)
	g.Must("grep -q gw.example.net /etc/hosts || echo '" + guestIP + " db.example.net gw.example.net gw1.example.net gw2.example.net' >> /etc/hosts")
	for _, name := range []string{"bcgw", "bcd-node"} {
		deb := e.deb(t, name)
		if err := g.Copy(deb, quickstartDir+"/"+filepath.Base(deb), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.installFakeSMI(t, "/usr/bin/nvidia-smi", smiCapture, "8.6", smiState)
	installFakeDriverProc(t, e)
	g.MustTimeout("systemctl enable --now postgresql.service haproxy.service 2>&1", 3*time.Minute)
	t.Logf("quick start: the guest prepared in %s", time.Since(start).Round(100*time.Millisecond))

	gw1 := func(args string) string { return g.Must("bcgw " + args) }
	gw2 := func(args string) string { return g.Must("BCGW_DATA_DIR=/var/lib/bcgw-gw2 bcgw " + args) }
	var nodeID string
	hooks := []*qsHook{
		{Role: "gateway-1", Match: "apt-get install -y ./bcgw_", Check: func(t *testing.T) { checkGatewayInstalled(t, e) }},
		{Role: "gateway-1", Match: "systemctl start bcgw", Check: func(t *testing.T) { checkGatewayServing(t, e, "bcgw.service", "/var/lib/bcgw") }},
		{Role: "node", Match: "install.sh", Check: func(t *testing.T) {
			g.WaitActive("bcd-helper.service", 90*time.Second)
			g.WaitActive("bcd.service", 90*time.Second)
			pid := e.mainPID(t, "bcd.service")
			if u := strings.TrimSpace(g.Must("ps -o user= -p " + pid)); u != "bcd" {
				t.Errorf("bcd.service runs as %s after install.sh --unprivileged, want bcd", u)
			}
			// The unprivileged node's namespace has a /proc of its own,
			// which the host's bind mount does not reach: the stand-in
			// driver's entries go on it too.
			g.Must("nsenter -t " + pid + " -m -- mount --bind " + fakeDriverDir + " /proc/driver")
			nodeID, _ = e.identity(t)
			if on := gatewayConnected(t, gw1, nodeID); on != "gw1" {
				t.Errorf("the node joined through the balancer is on %q, want gw1 (gw2 is not started yet)", on)
			}
		}},
		{Role: "gateway-1", Match: "bcgw spec set", Check: func(t *testing.T) {
			convergedAtSpec(t, gw1, nodeID, "host")
			if v := strings.TrimSpace(g.Must("sysctl -n vm.swappiness")); v != "10" {
				t.Errorf("the host section converged, vm.swappiness is %s, want the spec's 10", v)
			}
		}},
		{Role: "node", Match: "bcd-alloc-job1", Before: true, Check: func(t *testing.T) {
			for _, u := range []string{"bcd.service", "bcd-helper.service"} {
				out, _, _ := g.Run("nsenter -t " + e.mainPID(t, u) + " -m -- sh -c 'grep -H Minor /proc/driver/nvidia/gpus/*/information; findmnt /proc/driver' 2>&1")
				t.Logf("the driver's GPUs as %s sees them:\n%s", u, out)
			}
			convergedAtSpec(t, gw1, nodeID, "devices")
		}},
		{Role: "node", Match: "bcd-alloc-job1", Check: func(t *testing.T) {
			if p := g.SliceLimits("bcd-alloc-job1.slice"); p["ActiveState"] != "active" || p["AllowedCPUs"] != "0" || p["MemoryMax"] != "268435456" {
				t.Errorf("the hold's slice: %v, want active with AllowedCPUs=0 and MemoryMax=268435456", p)
			}
		}},
		{Role: "gateway-2", Match: "bcgw@gw2", Check: func(t *testing.T) {
			checkGatewayServing(t, e, "bcgw@gw2.service", "/var/lib/bcgw-gw2")
			if p1, p2 := gw1("well-known --pins"), gw2("well-known --pins"); p1 != p2 {
				t.Errorf("gw2's pins are not gw1's:\n%s\n%s", p2, p1)
			}
			if on := gatewayConnected(t, gw2, nodeID); on != "gw1" {
				t.Errorf("gw2 says the node is on %q, want gw1", on)
			}
		}},
		{Role: "gateway-2", Match: "agent.ping", Check: func(t *testing.T) {
			if on := gatewayConnected(t, gw2, nodeID); on != "gw2" {
				t.Errorf("after gw1 stopped, the node is on %q, want gw2", on)
			}
		}},
	}
	for i, b := range blocks {
		if b.From != "" {
			runQuickstartCopy(t, e, b)
			continue
		}
		for _, h := range hooks {
			if h.Before && !h.done && h.Role == b.Role && strings.Contains(b.Script, h.Match) {
				h.done = true
				h.Check(t)
			}
		}
		began := time.Now()
		script := strings.NewReplacer("@STATE@", fmt.Sprintf("%s/.vars-%s", quickstartDir, b.Role), "@BLOCK@", b.Script).Replace(qsWrapper)
		file := fmt.Sprintf("%s/.block-%02d.sh", quickstartDir, i)
		if err := g.Put(file, []byte(script), 0o700); err != nil {
			t.Fatal(err)
		}
		out, code, err := g.RunTimeout("bash "+file+" 2>&1", aptDeadline)
		if err != nil {
			t.Fatalf("%s\nfailed (exit %d: %v), its output:\n%s\njournal:\n%s", b, code, err, out,
				g.Must("journalctl --no-pager -o cat -n 40 -u bcgw.service -u bcgw@gw2.service -u bcd.service -u haproxy.service -u postgresql@15-main.service; true"))
		}
		t.Logf("docs/quickstart.md:%d on %s, %s:\n%s", b.Line, b.Role, time.Since(began).Round(10*time.Millisecond), tail(out, 1500))
		for _, h := range hooks {
			if !h.Before && !h.done && h.Role == b.Role && strings.Contains(b.Script, h.Match) {
				h.done = true
				h.Check(t)
			}
		}
	}
	for _, h := range hooks {
		if !h.done {
			t.Errorf("docs/quickstart.md has no block on %s with %q, which this test checks around", h.Role, h.Match)
		}
	}
	t.Logf("quick start: the page ran in %s", time.Since(start).Round(100*time.Millisecond))

	// The gateway that holds the node's session, killed.
	checkKilledRestarted(t, e, "bcgw@gw2.service", gw1, nodeID)
	e.checkExposure(t, "package", "bcgw.service", "bcgw@gw2.service")
}

// fakeDriverGPUs are the driver's /proc/driver/nvidia/gpus entries of the
// stand-in nvidia-smi's two GPUs (smiCapture: the same UUIDs, buses and
// device minors), where the node and the helper read the minors a hold's
// device files name.
var fakeDriverGPUs = []struct{ bus, uuid, minor string }{
	{"0000:81:00.0", smiGPU0, "1"},
	{"0000:c1:00.0", "GPU-12345678-aaaa-bbbb-cccc-0123456789cd", "0"},
}

const fakeDriverDir = "/run/bcd-test-proc-driver"

// installFakeDriverProc puts the driver's GPU entries, as the NVIDIA
// kernel driver writes them, on a directory bind-mounted over
// /proc/driver (the guest has no such driver), before the node's units
// start and take the host's mounts into their namespaces.
func installFakeDriverProc(t *testing.T, e *systemdEnv) {
	t.Helper()
	const dir = fakeDriverDir
	var sh strings.Builder
	fmt.Fprintf(&sh, "mountpoint -q /proc/driver && umount /proc/driver; rm -rf %s && ", dir)
	for _, g := range fakeDriverGPUs {
		d := dir + "/nvidia/gpus/" + g.bus
		fmt.Fprintf(&sh, "mkdir -p %s && printf 'Model: \t\t NVIDIA RTX A5000\nIRQ:   \t\t 130\nGPU UUID: \t %s\nVideo BIOS: \t 94.02.5c.00.01\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t %s\nDevice Minor: \t %s\n' > %s/information && ",
			d, g.uuid, g.bus, g.minor, d)
	}
	fmt.Fprintf(&sh, "mount --bind %s /proc/driver && cat /proc/driver/nvidia/gpus/*/information", dir)
	t.Logf("the stand-in driver's /proc/driver/nvidia/gpus:\n%s", e.g.Must(sh.String()))
}

// runQuickstartCopy moves a file as the page's "copy A to B" says. In the
// one guest both machines are the same file system: a copy to the same
// path is already done.
func runQuickstartCopy(t *testing.T, e *systemdEnv, b qsBlock) {
	t.Helper()
	abs := func(place string) string {
		_, p, _ := strings.Cut(place, ":")
		if !path.IsAbs(p) {
			p = path.Join(quickstartDir, p)
		}
		return p
	}
	from, to := abs(b.From), abs(b.To)
	if _, code, _ := e.g.Run("test -f " + shellQuote(from)); code != 0 {
		t.Fatalf("%s: there is no %s to copy", b, from)
	}
	if from != to {
		e.g.Must("cp --preserve=mode " + shellQuote(from) + " " + shellQuote(to))
	}
}

// convergedAtSpec waits until the node has observed the gateway's
// desired spec generation (run: bcgw on a gateway) and section is
// CONVERGED in it.
func convergedAtSpec(t *testing.T, run func(string) string, node, section string) {
	t.Helper()
	var st struct {
		SpecGeneration uint64 `json:"spec_generation"`
	}
	if err := json.Unmarshal([]byte(run("status "+node+" --json")), &st); err != nil || st.SpecGeneration == 0 {
		t.Fatalf("bcgw status %s --json: no spec generation (%v)", node, err)
	}
	waitSectionBy(t, func() ([]byte, error) { return []byte(run("status " + node + " --json")), nil }, node, st.SpecGeneration, section, "CONVERGED")
}

// waitSectionBy waits until the node's status (from status, a bcgw status
// --json) has observed generation gen or later and section name in state,
// and returns the section's message.
func waitSectionBy(t *testing.T, status func() ([]byte, error), node string, gen uint64, name, state string) string {
	t.Helper()
	var last string
	var out []byte
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st struct {
			ObservedGeneration uint64 `json:"observed_generation"`
			Sections           []struct{ Name, State, Message string }
		}
		var err error
		out, err = status()
		if err == nil && json.Unmarshal(out, &st) == nil && st.ObservedGeneration >= gen {
			for _, s := range st.Sections {
				if s.Name == name {
					last = s.State + ": " + s.Message
					if s.State == state {
						return s.Message
					}
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %s section of %s at generation %d: %q after 2m, want %s\n%s", name, node, gen, last, state, out)
		}
		time.Sleep(time.Second)
	}
}
