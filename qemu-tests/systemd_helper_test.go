package qemutests

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The systemd tier's steps that go through bcd helper in the unprivileged
// install (the node runs as bcd, the helper as root): gpu.reset against a
// stand-in nvidia-smi, and the access section's ssh.reload of the guest's
// real sshd. Their helpers (commandResult, helperOps, journalSince,
// installFakeSMI, waitSection) are for other steps too.

// fakeSMI is a stand-in nvidia-smi (the guest has no GPU). It answers
// `-q -x` with a capture of a real one (components/machine/nvsmi/testdata),
// `-L` and `--query-gpu=uuid[,compute_cap]` from the same GPUs, and
// `-r`/`--gpu-reset -i ID` (index, UUID or PCI bus id) by appending the GPU
// to STATE/resets: a directory that is root's and closed to others, so a
// reset by any other uid fails as the real one does without root. Each call
// is logged to the journal (tag fake-nvidia-smi) with its uid, unit and
// arguments. XML, CC and STATE are filled in by installFakeSMI.
const fakeSMI = `#!/bin/sh
# nvidia-smi stand-in of bcd's systemd tier (qemu-tests/systemd_helper_test.go).
xml=@XML@
cc=@CC@
state=@STATE@
logger -t fake-nvidia-smi "uid=$(id -u) unit=$(sed -n 's|^0::.*/||p' /proc/self/cgroup) $0 $*" 2>/dev/null || true
uuids() { sed -n 's:.*<uuid>\(GPU-[^<]*\)</uuid>.*:\1:p' "$xml"; }
buses() { sed -n 's:.*<gpu id="\([^"]*\)">.*:\1:p' "$xml"; }
case "$*" in
"-q -x") exec cat "$xml" ;;
"-L")
	i=0
	for u in $(uuids); do echo "GPU $i: NVIDIA GPU (UUID: $u)"; i=$((i + 1)); done ;;
"--query-gpu=uuid --format=csv,noheader") uuids ;;
"--query-gpu=uuid,compute_cap --format=csv,noheader")
	for u in $(uuids); do echo "$u, $cc"; done ;;
"-r -i "* | "--gpu-reset -i "*)
	want=$(echo "$3" | tr '[:upper:]' '[:lower:]')
	i=0 found=""
	for b in $(buses); do
		u=$(uuids | sed -n "$((i + 1))p")
		lb=$(echo "$b" | tr '[:upper:]' '[:lower:]')
		lu=$(echo "$u" | tr '[:upper:]' '[:lower:]')
		if [ "$want" = "$i" ] || [ "$want" = "$lu" ] || [ "$want" = "$lb" ]; then found="$b $u"; fi
		i=$((i + 1))
	done
	if [ -z "$found" ]; then echo "No devices were found" >&2; exit 6; fi
	if ! echo "$found" 2>/dev/null >>"$state/resets"; then
		echo "Unable to reset GPU ${found%% *}: Insufficient Permissions" >&2
		exit 4
	fi
	echo "GPU ${found%% *} was successfully reset."
	echo "All done." ;;
*) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help." >&2; exit 2 ;;
esac
`

// installFakeSMI puts fakeSMI at path in the guest answering from the
// capture (a file under components/machine/nvsmi/testdata) with compute
// capability cc, resets recorded under the root-only directory state.
func (e *systemdEnv) installFakeSMI(t *testing.T, path, capture, cc, state string) {
	t.Helper()
	xml := "/usr/share/bcd-test/" + capture
	if err := e.g.Copy(filepath.Join(e.repo, "components/machine/nvsmi/testdata", capture), xml, 0o644); err != nil {
		t.Fatal(err)
	}
	script := strings.NewReplacer("@XML@", xml, "@CC@", cc, "@STATE@", state).Replace(fakeSMI)
	if err := e.g.Put(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e.g.Must("install -d -m 0700 -o root -g root " + shellQuote(state))
}

// commandResult is what bcgw run --wait printed of a command.
type commandResult struct {
	ID     string          `json:"id"`
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Output json.RawMessage `json:"output"`
}

// command runs kind on the node through bcgw and waits for its result,
// which it returns whether or not the command succeeded.
func (e *systemdEnv) command(t *testing.T, node, kind, body string) commandResult {
	t.Helper()
	start := time.Now()
	args := []string{"run", node, kind, "--wait", "--timeout", "2m", "--data-dir", e.gwDir}
	if body != "" {
		args = append(args, "--body", body)
	}
	out, err := exec.Command(e.bin, args...).Output()
	var r commandResult
	if jerr := json.Unmarshal(out, &r); jerr != nil || r.Status == "" {
		t.Fatalf("bcgw %v: %v (%v)\n%s", args, err, jerr, out)
	}
	t.Logf("bcgw run %s %s %s: %s in %s %s%s", node, kind, body, r.Status, time.Since(start).Round(10*time.Millisecond), r.Error, tail(string(r.Output), 300))
	return r
}

// guestNow is the guest's clock, for journalSince.
func (e *systemdEnv) guestNow(t *testing.T) string {
	t.Helper()
	return "@" + strings.TrimSpace(e.g.Must("date +%s"))
}

// journalSince is the journal (message text only) of the journalctl
// selection args since a guestNow time.
func (e *systemdEnv) journalSince(t *testing.T, since string, args ...string) string {
	t.Helper()
	return e.g.Must("journalctl --no-pager -o cat --since " + since + " " + strings.Join(args, " "))
}

// helperOps are the helper's "helper: operation" log records since a
// guestNow time, from its journal.
func (e *systemdEnv) helperOps(t *testing.T, since string) []map[string]any {
	t.Helper()
	var ops []map[string]any
	for _, l := range strings.Split(e.journalSince(t, since, "-u bcd-helper.service"), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "helper: operation" {
			ops = append(ops, m)
		}
	}
	return ops
}

// waitSection waits until the node has observed generation gen and its
// section name is in state, and returns the section's message.
func (e *systemdEnv) waitSection(t *testing.T, node string, gen uint64, name, state string) string {
	t.Helper()
	return waitSectionBy(t, func() ([]byte, error) {
		return exec.Command(e.bin, "status", node, "--json", "--data-dir", e.gwDir).Output()
	}, node, gen, name, state)
}

// The GPUs of the capture the helper's nvidia-smi answers with (two RTX
// A5000s), and the node-only one (a T4) of the refusal.
const (
	smiCapture    = "dual-rtx-a5000.590.44.01.xml"
	smiGPU0       = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
	smiGPU0Bus    = "00000000:81:00.0"
	smiNodeOnly   = "tesla-t4.515.105.01.xml"
	smiNodeOnlyID = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
	smiState      = "/var/lib/bcd-test-nvidia"
)

// stepGPUReset: in the unprivileged install, gpu.reset sent through bcgw
// is run by the helper (root) with its own nvidia-smi; the node (bcd)
// cannot reset the GPU itself; and the helper refuses a GPU its own
// nvidia-smi does not list, even when the node's (an nvidia-smi earlier
// on the node's PATH, which the helper never looks at) does.
func stepGPUReset(t *testing.T, e *systemdEnv) {
	e.installFakeSMI(t, "/usr/bin/nvidia-smi", smiCapture, "8.6", smiState)
	defer e.g.Run("rm -rf /usr/bin/nvidia-smi /usr/local/bin/nvidia-smi " + smiState + " /usr/share/bcd-test")
	bcdUID := strings.TrimSpace(e.g.Must("id -u bcd"))
	since := e.guestNow(t)

	// Nothing is held: the reset of GPU 0 (by index) goes to the helper.
	r := e.command(t, e.nodeID, "gpu.reset", `{"gpu":"0"}`)
	if r.Status != "SUCCEEDED" || !strings.Contains(string(r.Output), smiGPU0) {
		t.Fatalf("gpu.reset of GPU 0: %s %s %s\njournal:\n%s", r.Status, r.Error, r.Output,
			e.journalSince(t, since, "-u bcd.service -u bcd-helper.service -t fake-nvidia-smi"))
	}
	calls := e.journalSince(t, since, "-t fake-nvidia-smi")
	t.Logf("nvidia-smi calls (uid, unit, argv):\n%s", tail(calls, 2500))
	wantReset := "uid=0 unit=bcd-helper.service /usr/bin/nvidia-smi --gpu-reset -i " + smiGPU0
	if !strings.Contains(calls, wantReset) {
		t.Errorf("no %q in nvidia-smi's calls", wantReset)
	}
	if !strings.Contains(calls, "uid="+bcdUID+" unit=bcd.service /usr/bin/nvidia-smi -q -x") {
		t.Errorf("the node (uid %s) did not list the GPUs itself", bcdUID)
	}
	for _, l := range strings.Split(calls, "\n") {
		if (strings.Contains(l, " -r ") || strings.Contains(l, "--gpu-reset")) && !strings.HasPrefix(l, "uid=0 unit=bcd-helper.service ") {
			t.Errorf("a reset not run by the helper: %s", l)
		}
	}
	if got := strings.TrimSpace(e.g.Must("cat " + smiState + "/resets")); got != smiGPU0Bus+" "+smiGPU0 {
		t.Errorf("resets recorded: %q, want one of %s", got, smiGPU0)
	}
	okOps := 0
	for _, o := range e.helperOps(t, since) {
		if o["op"] == "gpu.reset" && o["outcome"] == "ok" && o["gpu"] == smiGPU0 && fmt.Sprint(o["uid"]) == bcdUID {
			okOps++
		}
	}
	if okOps != 1 {
		t.Errorf("%d gpu.reset ok from uid %s in the helper's journal, want 1", okOps, bcdUID)
	}

	// The node's account cannot reset it itself.
	out, code, _ := e.g.Run("runuser -u bcd -- nvidia-smi -r -i " + smiGPU0Bus + " 2>&1")
	t.Logf("nvidia-smi -r -i %s as bcd: exit %d: %s", smiGPU0Bus, code, strings.TrimSpace(out))
	if code == 0 || !strings.Contains(out, "Insufficient Permissions") {
		t.Errorf("bcd could reset the GPU itself (exit %d: %s)", code, out)
	}
	if n := strings.Count(e.g.Must("cat "+smiState+"/resets"), "\n"); n != 1 {
		t.Errorf("%d resets recorded after bcd's attempt, want 1", n)
	}

	// A GPU only the node's nvidia-smi lists: the helper's own (in the
	// system directories, never the node's PATH) does not, so it refuses.
	e.installFakeSMI(t, "/usr/local/bin/nvidia-smi", smiNodeOnly, "7.5", smiState)
	since = e.guestNow(t)
	r = e.command(t, e.nodeID, "gpu.reset", `{"gpu":"`+smiNodeOnlyID+`"}`)
	if r.Status == "SUCCEEDED" || !strings.Contains(r.Error, "is not a GPU of this host") {
		t.Errorf("gpu.reset of a GPU the helper's nvidia-smi does not list: %s %s, want the helper's refusal", r.Status, r.Error)
	}
	refused := 0
	for _, o := range e.helperOps(t, since) {
		t.Logf("helper: %v", o)
		if o["op"] == "gpu.reset" && o["outcome"] == "refused" && o["gpu"] == smiNodeOnlyID {
			refused++
		}
	}
	if refused != 1 {
		t.Errorf("%d refused gpu.reset of %s in the helper's journal, want 1", refused, smiNodeOnlyID)
	}
	calls = e.journalSince(t, since, "-t fake-nvidia-smi")
	if strings.Contains(calls, "uid=0 unit=bcd-helper.service /usr/local/bin/") {
		t.Errorf("the helper ran the nvidia-smi on the node's PATH:\n%s", calls)
	}
	if n := strings.Count(e.g.Must("cat "+smiState+"/resets"), "\n"); n != 1 {
		t.Errorf("%d resets recorded after the refusal, want 1", n)
	}
}

// reloadedRe is systemd's line for a finished reload of ssh.service.
var reloadedRe = regexp.MustCompile(`Reloaded (ssh\.service|OpenBSD Secure Shell server)`)

// stepSSHReload: bcgw ssh-ca gives the node's access section an SSH CA
// and a principal for a local account; the unprivileged node has the
// helper render sshd's files (sshd -t accepts them) and reload the
// guest's ssh.service (reloaded, not restarted), and a certificate from
// bcgw ssh-sign logs in to the real sshd from the host side.
func stepSSHReload(t *testing.T, e *systemdEnv) {
	const acct = "bcdops"
	e.g.WaitActive("ssh.service", time.Minute)
	e.g.Must("id " + acct + " >/dev/null 2>&1 || { useradd --create-home --shell /bin/sh " + acct + " && usermod -p '*' " + acct + "; }")
	pid := e.mainPID(t, "ssh.service")
	since := e.guestNow(t)

	var v struct{ Generations map[string]uint64 }
	if err := json.Unmarshal([]byte(e.bcgw(t, "ssh-ca", e.nodeID, "--account", acct, "--json")), &v); err != nil {
		t.Fatal(err)
	}
	e.waitSection(t, e.nodeID, v.Generations[e.nodeID], "access", "CONVERGED")
	t.Logf("sshd's drop-in as the helper rendered it:\n%s", e.g.Must("cat /etc/ssh/sshd_config.d/10-better-compute.conf"))
	var journal string
	waitFor(t, "ssh.service reloaded", time.Minute, func() bool {
		journal = e.journalSince(t, since, "-u ssh.service")
		return reloadedRe.MatchString(journal)
	})
	t.Logf("ssh.service's journal since the access section:\n%s", journal)
	if after := e.mainPID(t, "ssh.service"); after != pid {
		t.Errorf("ssh.service's main process went from %s to %s: restarted, not reloaded", pid, after)
	}
	if out, code, _ := e.g.Run("sshd -t 2>&1"); code != 0 {
		t.Errorf("sshd -t refuses the rendered configuration: %s", out)
	}
	conf := e.g.Must("sshd -T 2>&1")
	for _, want := range []string{"trustedusercakeys /etc/ssh/bc_ca.pub", "revokedkeys /etc/ssh/bc_krl", "authorizedprincipalsfile /etc/ssh/bc_principals/%u"} {
		if !strings.Contains(conf, want+"\n") {
			t.Errorf("sshd -T lacks %q", want)
		}
	}
	if p := strings.TrimSpace(e.g.Must("cat /etc/ssh/bc_principals/" + acct)); p != e.nodeID+":"+acct {
		t.Errorf("the principals file of %s: %q", acct, p)
	}
	bcdUID := strings.TrimSpace(e.g.Must("id -u bcd"))
	applied := false
	for _, o := range e.helperOps(t, since) {
		if o["op"] == "access.apply" && o["outcome"] == "ok" && fmt.Sprint(o["uid"]) == bcdUID {
			applied = true
		}
	}
	if !applied {
		t.Errorf("no access.apply from uid %s in the helper's journal:\n%s", bcdUID, e.journalSince(t, since, "-u bcd-helper.service"))
	}

	// The real sshd takes a certificate of the CA for NODE:ACCOUNT.
	keys := t.TempDir()
	key := filepath.Join(keys, "user")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "systemd-tier", "-f", key).CombinedOutput(); err != nil {
		need(t, "ssh-keygen (openssh-client)", fmt.Errorf("%v: %s", err, out))
	}
	e.bcgw(t, "ssh-sign", "--principal", e.nodeID+":"+acct, "--pubkey", key+".pub")
	if _, err := exec.LookPath("ssh"); err != nil {
		need(t, "ssh (openssh-client)", err)
	}
	args := []string{"-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30",
		"-i", key, "-o", "CertificateFile=" + key + "-cert.pub", acct + "@" + guestIP, "id -un"}
	start := time.Now()
	out, err := e.ns.cmd(t.Context(), "ssh", args...).CombinedOutput()
	t.Logf("ssh %s@%s id -un with the certificate (from the host side): %q %v in %s", acct, guestIP, strings.TrimSpace(string(out)), err, time.Since(start).Round(10*time.Millisecond))
	if err != nil || strings.TrimSpace(string(out)) != acct {
		t.Errorf("the certificate did not log in: %v %s\n%s", err, out, e.journalSince(t, since, "-u ssh.service"))
	}
}
