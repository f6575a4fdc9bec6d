//go:build linux

package helper

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/testenv"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/tpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// TestRootEndToEnd runs the real thing as root: a real unprivileged user,
// the bcd-helper binary (built with the helpere2e tag for its helper-call
// command) serving as root, and helper-call run as that user to write and
// remove a CDI spec of the table under /etc/cdi (for a GPU of a stand-in
// /proc/driver/nvidia), and to have a spec with a hook and one for a GPU
// the host lacks refused. The same request from
// another uid, from the user with another primary group, and from a copy
// of the binary (another file) gets "not allowed"; with that copy as
// [helper] entrypoint it is allowed.
func TestRootEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.NeedRoot(t, "TestRootEndToEnd creates a user with useradd and runs bcd helper as root")
	}
	for _, tool := range []string{"useradd", "userdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Skip(t, "TestRootEndToEnd needs %s: %v (apt-get install passwd)", tool, err)
		}
	}
	rnd := randomHex(t, 4)

	// A base directory root owns alone, that the test user can traverse.
	base, err := os.MkdirTemp("/run", "bcd-helper-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	for _, d := range []string{"bin", "other", "etc", "run"} {
		must(t, os.Mkdir(filepath.Join(base, d), 0o755))
	}
	bin := filepath.Join(base, "bin", "bcd-helper")
	build(t, bin)
	copyBin := filepath.Join(base, "other", "bcd-helper")
	copyFile(t, bin, copyBin)

	name := "bcdtest-" + rnd
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
		if _, err := user.LookupGroup(name); err == nil {
			exec.Command("groupdel", name).Run()
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)

	// The file of the table the test writes, and /etc/cdi as it was.
	id := "e2e-" + rnd
	target := "/etc/cdi/bcd-" + id + ".json"
	_, statErr := os.Lstat("/etc/cdi")
	cdiExisted := statErr == nil
	t.Cleanup(func() {
		os.Remove(target)
		if !cdiExisted {
			os.Remove("/etc/cdi") // only when empty
		}
	})

	// Slices: with systemd running, the real systemctl and
	// /run/systemd/system; without (a container), a helpere2e build's
	// stand-ins: a systemctl that logs its arguments, a unit root and a
	// cgroup tree under base.
	sl := newSliceEnv(t, base, rnd)

	// The host's GPUs, as the helper reads them: a helpere2e build's
	// stand-in /proc with one NVIDIA GPU of minor 0 (this machine may
	// have none).
	proc := filepath.Join(base, "proc")
	gpuInfo := filepath.Join(proc, "driver/nvidia/gpus/0000:18:00.0/information")
	must(t, os.MkdirAll(filepath.Dir(gpuInfo), 0o755))
	must(t, os.WriteFile(gpuInfo, []byte("Model: \t\t NVIDIA H100 80GB HBM3\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 0\n"), 0o444))
	procEnv := "BCD_HELPER_E2E_PROC=" + proc

	socket := filepath.Join(base, "run", "helper.sock")
	logs := startBinary(t, bin, base, "a", socket, name, "", append(sl.env, procEnv)...)

	fi, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Uid != 0 || int(st.Gid) != gid {
		t.Errorf("socket %v %d:%d, want 0660 root:%d", fi.Mode(), st.Uid, st.Gid, gid)
	}

	gpu := cdispec.GPU{UUID: "GPU-00000000-0000-4000-8000-0000000000e2", Node: "/dev/nvidia0"}
	specBytes, err := cdispec.Render(id, []cdispec.GPU{gpu})
	if err != nil {
		t.Fatal(err)
	}
	spec := string(specBytes)
	write := `{"v":1,"op":"file.write","kind":"cdi","id":"` + id + `","data":"` + base64.StdEncoding.EncodeToString([]byte(spec)) + `"}`
	remove := `{"v":1,"op":"file.remove","kind":"cdi","id":"` + id + `"}`
	asUser := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	notAllowedAnswer := `{"v":1,"ok":false,"error":"not allowed","retryable":false}`

	// Refused callers first: nothing may appear.
	refused := []struct {
		name string
		exe  string
		cred *syscall.Credential
	}{
		{"another uid", bin, &syscall.Credential{Uid: 65534, Gid: uint32(gid)}},
		{"the user with another primary group", bin, &syscall.Credential{Uid: uint32(uid), Gid: 65534, Groups: []uint32{uint32(gid)}}},
		{"a binary that is not an installed bcd", copyBin, asUser},
	}
	for _, r := range refused {
		t.Run(r.name, func(t *testing.T) {
			out, code := call(t, r.exe, socket, r.cred, write)
			if out != notAllowedAnswer || code != 1 {
				t.Errorf("answer %q exit %d, want %s", out, code, notAllowedAnswer)
			}
			if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists after a refused request: %v", target, err)
			}
		})
	}

	// The user running the installed binary writes and removes the file.
	if out, code := call(t, bin, socket, asUser, write); out != `{"v":1,"ok":true}` || code != 0 {
		t.Fatalf("file.write as %s: %q exit %d\nhelper log:\n%s", name, out, code, logs.String())
	}
	fi, err = os.Lstat(target)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || st.Uid != 0 {
		t.Errorf("%s: %v uid %d, want a 0644 file of root's", target, fi.Mode(), st.Uid)
	}
	if b, _ := os.ReadFile(target); string(b) != spec {
		t.Errorf("%s = %q", target, b)
	}
	// A spec with a hook, and one for a GPU this host lacks, are refused
	// and the spec written stays as it was.
	hooked := strings.Replace(spec, `"deviceNodes"`, `"hooks": [{"hookName": "createContainer", "path": "/bin/sh", "args": ["sh", "-c", "id"]}], "deviceNodes"`, 1)
	other, err := cdispec.Render(id, []cdispec.GPU{{UUID: gpu.UUID, Node: "/dev/nvidia1"}})
	if err != nil {
		t.Fatal(err)
	}
	for data, want := range map[string]string{
		hooked:        `CDI spec: json: unknown field \"hooks\"`,
		string(other): `device node \"/dev/nvidia1\" is neither a GPU of this host, a MIG instance's capability of one, nor an NVIDIA control device (this host has the GPU device nodes /dev/nvidia0)`,
	} {
		req := `{"v":1,"op":"file.write","kind":"cdi","id":"` + id + `","data":"` + base64.StdEncoding.EncodeToString([]byte(data)) + `"}`
		if out, code := call(t, bin, socket, asUser, req); !strings.Contains(out, want) || !strings.HasSuffix(out, `"retryable":false}`) || code != 1 {
			t.Errorf("a refused spec: %q exit %d, want a refusal containing %s", out, code, want)
		}
		if b, _ := os.ReadFile(target); string(b) != spec {
			t.Errorf("%s after a refused spec = %q", target, b)
		}
	}
	// What the client refuses before sending, the helper refuses too.
	for req, want := range map[string]string{
		`{"v":1,"op":"file.write","kind":"cdi","id":"../../tmp/x"}`:            "does not fit file kind cdi",
		`{"v":1,"op":"file.write","kind":"cdi","id":"x","path":"/etc/passwd"}`: `unknown field \"path\"`,
		`{"v":2,"op":"file.write","kind":"cdi","id":"x"}`:                      "protocol version 2",
	} {
		if out, code := call(t, bin, socket, asUser, req, "--raw"); !strings.Contains(out, want) || code != 1 {
			t.Errorf("%s: %q exit %d, want a refusal containing %s", req, out, code, want)
		}
	}
	if out, code := call(t, bin, socket, asUser, remove); out != `{"v":1,"ok":true}` || code != 0 {
		t.Fatalf("file.remove: %q exit %d", out, code)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after file.remove: %v", target, err)
	}

	// ping, as bcd doctor sends it.
	if out, code := call(t, bin, socket, asUser, `{"v":1,"op":"ping"}`); out != `{"v":1,"ok":true}` || code != 0 {
		t.Errorf("ping as %s: %q exit %d", name, out, code)
	}
	// gpu.reset of a GPU this host does not have: refused, or failed
	// without nvidia-smi, and never reset.
	if out, code := call(t, bin, socket, asUser, `{"v":1,"op":"gpu.reset","gpu":"GPU-00000000-0000-4000-8000-0000000000e2"}`); code != 1 ||
		!strings.Contains(out, "nvidia-smi is not installed on this host") && !strings.Contains(out, "is not a GPU of this host") {
		t.Errorf("gpu.reset of another host's GPU: %q exit %d", out, code)
	}
	t.Run("slice", func(t *testing.T) { sl.roundTrip(t, bin, socket, asUser) })

	// The log: each refusal with pid, uid and reason; each operation with
	// pid, op, kind, id and outcome.
	text := logs.String()
	for _, want := range []string{
		`"msg":"helper: connection refused"`, `"uid":65534`, `"reason":"uid 65534 gid`,
		`is not bcd (neither this helper's binary, [helper] entrypoint nor a self-update slot)`,
		`"msg":"helper: operation"`, `"op":"file.write","kind":"cdi","id":"` + id + `"`, `"outcome":"ok"`,
		`"op":"file.remove"`, `"outcome":"refused","error":"file.write ` + target + `: CDI spec: json: unknown field \"hooks\"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("helper log lacks %s:\n%s", want, text)
		}
	}

	// tpm.*: on a host without a TPM, wire.NoTPM; against a swtpm
	// (a helpere2e build's BCD_HELPER_E2E_SWTPM), a tpm.sign round trip as
	// the user that verifies against the key tpm.nodekey answered.
	t.Run("tpm", func(t *testing.T) {
		if _, err := os.Stat(tpm.DefaultPath); errors.Is(err, fs.ErrNotExist) {
			out, code := call(t, bin, socket, asUser, `{"v":1,"op":"tpm.ak"}`)
			if want := `{"v":1,"ok":false,"error":"` + wire.NoTPM + `","retryable":false}`; out != want || code != 1 {
				t.Errorf("tpm.ak on a host without a TPM: %q exit %d, want %s", out, code, want)
			}
		}
		addr := swtpmtest.Start(t, "").Addr
		socket4 := filepath.Join(base, "run", "helper4.sock")
		tpmLogs := startBinary(t, bin, base, "d", socket4, name, "", "BCD_HELPER_E2E_SWTPM="+addr)
		u := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xe2}, 32))
		digest := sha256.Sum256([]byte("root end-to-end"))
		answer := func(req string) *wire.Response {
			out, code := call(t, bin, socket4, asUser, req)
			resp, err := wire.DecodeResponse([]byte(out))
			if err != nil || !resp.OK || code != 0 {
				t.Fatalf("%s as %s: %q exit %d (%v)\nhelper log:\n%s", req, name, out, code, err, tpmLogs.String())
			}
			return resp
		}
		pub, err := tpm.CheckNodeKeyPublic(answer(`{"v":1,"op":"tpm.nodekey","unique":"` + u + `"}`).Public)
		if err != nil {
			t.Fatal(err)
		}
		sig := answer(`{"v":1,"op":"tpm.sign","unique":"` + u + `","digest":"` + base64.StdEncoding.EncodeToString(digest[:]) + `"}`).Signature
		if !ecdsa.VerifyASN1(pub, digest[:], sig) {
			t.Error("tpm.sign's signature does not verify against tpm.nodekey's key")
		}
		if out, code := call(t, bin, socket4, asUser, `{"v":1,"op":"tpm.sign","unique":"`+u+`","digest":"AAAA"}`, "--raw"); code != 1 ||
			!strings.Contains(out, "digest is 3 bytes, want 32, 48 or 64") {
			t.Errorf("tpm.sign of a 3-byte digest: %q exit %d", out, code)
		}
		if text := tpmLogs.String(); !strings.Contains(text, `"op":"tpm.nodekey"`) || strings.Contains(text, `"op":"tpm.sign","key":"e2e2e2e2e2e2e2e2","outcome":"ok"`) ||
			!strings.Contains(text, `"op":"tpm.sign","key":"e2e2e2e2e2e2e2e2","outcome":"refused"`) {
			t.Errorf("the helper log should have tpm.nodekey and the refused tpm.sign, not the successful one:\n%s", text)
		}
	})

	// With the copy as [helper] entrypoint, the copy is allowed.
	t.Run("entrypoint", func(t *testing.T) {
		socket2 := filepath.Join(base, "run", "helper2.sock")
		startBinary(t, bin, base, "b", socket2, name, copyBin, procEnv)
		if out, code := call(t, copyBin, socket2, asUser, write); out != `{"v":1,"ok":true}` || code != 0 {
			t.Fatalf("file.write from the entrypoint: %q exit %d", out, code)
		}
		if out, code := call(t, copyBin, socket2, asUser, remove); out != `{"v":1,"ok":true}` || code != 0 {
			t.Fatalf("file.remove from the entrypoint: %q exit %d", out, code)
		}
		third := filepath.Join(base, "other", "bcd-helper-3")
		copyFile(t, bin, third)
		if out, _ := call(t, third, socket2, asUser, write); out != notAllowedAnswer {
			t.Errorf("a third copy: %q", out)
		}
	})

	// The node side: the installed bcd node (the entrypoint) refuses to
	// run as root under [helper], and its bcd doctor, run as the user,
	// finds the helper answering and letting it in; run as another uid it
	// says that uid may not connect.
	t.Run("node", func(t *testing.T) {
		node := filepath.Join(base, "bin", "bcd")
		buildRole(t, node, "node", "")
		socket3 := filepath.Join(base, "run", "helper3.sock")
		startBinary(t, bin, base, "c", socket3, name, node)
		dataDir := filepath.Join(base, "data")
		must(t, os.Mkdir(dataDir, 0o700))
		must(t, os.Chown(dataDir, uid, gid))
		nodeCfg := filepath.Join(base, "etc", "node.toml")
		must(t, os.WriteFile(nodeCfg, []byte(fmt.Sprintf("gateway = \"https://127.0.0.1:9\"\ndata_dir = %q\n\n[helper]\nsocket = %q\nuser = %q\nentrypoint = %q\n", dataDir, socket3, name, node)), 0o644))

		out, code := runAs(t, node, nil, "node", "--config", nodeCfg)
		if code != 1 || !strings.Contains(out, "bcd node: runs as root, but config.toml has [helper]: start bcd node as "+name) {
			t.Errorf("bcd node as root under [helper]: exit %d\n%s", code, out)
		}
		out, _ = runAs(t, node, asUser, "node", "--config", nodeCfg)
		if strings.Contains(out, "[helper]") || !strings.Contains(out, "has not joined") {
			t.Errorf("bcd node as %s should pass the user check and stop at the join:\n%s", name, out)
		}

		out, _ = runAs(t, node, asUser, "doctor", "--config", nodeCfg)
		if !strings.Contains(out, "ok    helper    "+socket3+" answers in ") {
			t.Errorf("bcd doctor as %s:\n%s", name, out)
		}
		out, _ = runAs(t, node, &syscall.Credential{Uid: 65534, Gid: 65534}, "doctor", "--config", nodeCfg)
		if !strings.Contains(out, "fail  helper    this user may not connect to "+socket3) {
			t.Errorf("bcd doctor as uid 65534:\n%s", out)
		}
	})
}

// runAs runs exe with args as cred (nil: as the test) and returns its
// output, both streams, and exit code.
func runAs(t *testing.T, exe string, cred *syscall.Credential, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(exe, args...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	b, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(b), exit.ExitCode()
	}
	if err != nil {
		t.Fatalf("running %s: %v", exe, err)
	}
	return string(b), 0
}

// sliceEnv is where the root end-to-end test follows slice.apply and
// slice.remove: the real systemd when it runs, else stand-ins under base
// that a helpere2e build takes from env.
type sliceEnv struct {
	real     bool
	id       string
	unitRoot string // "/" or base/sysroot
	cgroup   string // the slice's cgroup directory (stand-ins only)
	log      string // the stand-in systemctl's log
	env      []string
}

func newSliceEnv(t *testing.T, base, rnd string) *sliceEnv {
	t.Helper()
	sl := &sliceEnv{id: "e2e_" + rnd, unitRoot: "/"}
	if fi, err := os.Lstat("/run/systemd/system"); err == nil && fi.IsDir() {
		sl.real = true
		t.Cleanup(func() {
			os.RemoveAll("/run/systemd/system/bcd-alloc-" + sl.id + ".slice.d")
			exec.Command("systemctl", "stop", "bcd-alloc-"+sl.id+".slice").Run()
			exec.Command("systemctl", "daemon-reload").Run()
		})
		return sl
	}
	fmt.Fprintln(os.Stderr, "NOTE TestRootEndToEnd: systemd is not running here (no /run/systemd/system): slice.apply and slice.remove run against a stand-in systemctl, unit root and cgroup tree")
	sl.unitRoot = filepath.Join(base, "sysroot")
	must(t, os.MkdirAll(filepath.Join(sl.unitRoot, "run/systemd/system"), 0o755))
	cg := filepath.Join(base, "cgroup")
	sl.cgroup = filepath.Join(cg, "bcd.slice/bcd-alloc.slice/bcd-alloc-"+sl.id+".slice")
	must(t, os.MkdirAll(sl.cgroup, 0o755))
	sl.log = filepath.Join(base, "run", "systemctl.log")
	fake := filepath.Join(base, "bin", "systemctl")
	must(t, os.WriteFile(fake, []byte("#!/bin/sh\necho \"$*\" >> "+sl.log+"\ncase \"$1\" in show) echo active ;; esac\n"), 0o755))
	sl.env = []string{"BCD_HELPER_E2E_SYSTEMCTL=" + fake, "BCD_HELPER_E2E_UNIT_ROOT=" + sl.unitRoot, "BCD_HELPER_E2E_CGROUP=" + cg}
	return sl
}

// roundTrip applies and removes the slice as the user, through helper-call
// (helperclient) from the installed binary.
func (sl *sliceEnv) roundTrip(t *testing.T, bin, socket string, asUser *syscall.Credential) {
	slice := "bcd-alloc-" + sl.id + ".slice"
	dropin := filepath.Join(sl.unitRoot, "run/systemd/system", slice+".d", "50-bcd.conf")
	apply := `{"v":1,"op":"slice.apply","slice":"` + slice + `","cpus":"0","mems":"0"}`
	remove := `{"v":1,"op":"slice.remove","slice":"` + slice + `"}`

	// Bounded by the host: CPU 8191 is refused and nothing is written.
	if out, code := call(t, bin, socket, asUser, `{"v":1,"op":"slice.apply","slice":"`+slice+`","cpus":"8191"}`); code != 1 || !strings.Contains(out, "CPU 8191 is not one of this host's online CPUs") {
		t.Errorf("slice.apply beyond the host: %q exit %d", out, code)
	}
	if _, err := os.Lstat(filepath.Dir(dropin)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s after a refused slice.apply: %v", filepath.Dir(dropin), err)
	}

	if out, code := call(t, bin, socket, asUser, apply); out != `{"v":1,"ok":true}` || code != 0 {
		t.Fatalf("slice.apply: %q exit %d", out, code)
	}
	fi, err := os.Lstat(dropin)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || st.Uid != 0 {
		t.Errorf("%s: %v uid %d, want a 0644 file of root's", dropin, fi.Mode(), st.Uid)
	}
	want := "# Written by bcd (slice.apply); slice.remove removes it.\n[Slice]\nAllowedCPUs=0\nAllowedMemoryNodes=0\n"
	if b, _ := os.ReadFile(dropin); string(b) != want {
		t.Errorf("%s = %q, want %q", dropin, b, want)
	}
	if sl.real {
		out, err := exec.Command("systemctl", "show", "--property=AllowedCPUs", "--value", slice).Output()
		if err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Errorf("systemctl show AllowedCPUs %s = %q, %v; want 0", slice, out, err)
		}
	} else {
		sl.wantCalls(t, "daemon-reload", "start "+slice)
		// A process in the slice: remove is refused, retryable, and the
		// drop-in stays.
		must(t, os.WriteFile(filepath.Join(sl.cgroup, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644))
		if out, code := call(t, bin, socket, asUser, remove); code != 1 || !strings.Contains(out, "still has processes") || !strings.HasSuffix(out, `"retryable":true}`) {
			t.Errorf("slice.remove of a slice in use: %q exit %d", out, code)
		}
		if _, err := os.Lstat(dropin); err != nil {
			t.Errorf("the drop-in after a refused slice.remove: %v", err)
		}
		sl.wantCalls(t)
		must(t, os.WriteFile(filepath.Join(sl.cgroup, "cgroup.events"), []byte("populated 0\nfrozen 0\n"), 0o644))
	}

	if out, code := call(t, bin, socket, asUser, remove); out != `{"v":1,"ok":true}` || code != 0 {
		t.Fatalf("slice.remove: %q exit %d", out, code)
	}
	if _, err := os.Lstat(filepath.Dir(dropin)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s after slice.remove: %v", filepath.Dir(dropin), err)
	}
	if sl.real {
		out, _ := exec.Command("systemctl", "show", "--property=ActiveState", "--value", slice).Output()
		if s := strings.TrimSpace(string(out)); s != "inactive" {
			t.Errorf("%s is %s after slice.remove", slice, s)
		}
	} else {
		sl.wantCalls(t, "show --property=ActiveState --value "+slice, "stop "+slice, "daemon-reload")
	}
}

// wantCalls checks the stand-in systemctl's log since the last check.
func (sl *sliceEnv) wantCalls(t *testing.T, want ...string) {
	t.Helper()
	b, err := os.ReadFile(sl.log)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	os.Remove(sl.log)
	var got []string
	if s := strings.TrimSpace(string(b)); s != "" {
		got = strings.Split(s, "\n")
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("systemctl ran %q, want %q", got, want)
	}
}

// startBinary writes config-NAME.toml and runs `bcd helper` as root until
// the test ends; it returns the helper's log.
func startBinary(t *testing.T, bin, base, name, socket, userName, entrypoint string, env ...string) *syncBuffer {
	t.Helper()
	cfg := fmt.Sprintf("[helper]\nsocket = %q\nuser = %q\n", socket, userName)
	if entrypoint != "" {
		cfg += fmt.Sprintf("entrypoint = %q\n", entrypoint)
	}
	cfgPath := filepath.Join(base, "etc", "config-"+name+".toml")
	must(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	logs := &syncBuffer{}
	cmd := exec.Command(bin, "helper", "--config", cfgPath)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logs
	cmd.Stdout = logs
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("bcd helper exited: %v\n%s", err, logs.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Error("bcd helper did not stop on SIGTERM")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if fi, err := os.Lstat(socket); err == nil && fi.Mode()&fs.ModeSocket != 0 {
			return logs
		}
		select {
		case err := <-exited:
			t.Fatalf("bcd helper exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket after 10s:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// call runs `bcd helper-call --socket S` from exe with cred, request on
// stdin, and returns its standard output and exit code.
func call(t *testing.T, exe, socket string, cred *syscall.Credential, request string, flags ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"helper-call", "--socket", socket}, flags...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	cmd.Stdin = strings.NewReader(request)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("running %s: %v", exe, err)
	}
	if stderr.Len() > 0 {
		t.Logf("helper-call stderr: %s", stderr.String())
	}
	return strings.TrimSpace(stdout.String()), code
}

// build builds roles/helper with the helpere2e tag into out.
func build(t *testing.T, out string) { buildRole(t, out, "helper", "helpere2e") }

// buildRole builds roles/ROLE with tags into out.
func buildRole(t *testing.T, out, role, tags string) {
	t.Helper()
	modRoot, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-tags", tags, "-o", out, "./roles/"+role)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(modRoot)))
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./roles/%s: %v\n%s", role, err, b)
	}
	must(t, os.Chmod(out, 0o755))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	must(t, out.Close())
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
