package qemutests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/bcx"
	"github.com/better-compute/bcd/components/bcx/ipmisim"
)

// The BMC's password: it must appear in no process's argv or environment
// and in no log of ours.
const ipmiQEMUPassword = "ipmi-Qemu-pw42"

// qmp runs one command on a QEMU's monitor and returns its "return".
func qmp(sock, command string) (json.RawMessage, error) {
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadBytes('\n'); err != nil { // the greeting
		return nil, err
	}
	var reply struct {
		Return json.RawMessage `json:"return"`
	}
	for _, cmd := range []string{`{"execute":"qmp_capabilities"}`, `{"execute":"` + command + `"}`} {
		if _, err := c.Write([]byte(cmd + "\n")); err != nil {
			return nil, err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, err
			}
			if bytes.Contains(line, []byte(`"return"`)) {
				if err := json.Unmarshal(line, &reply); err != nil {
					return nil, err
				}
				break
			}
		}
	}
	return reply.Return, nil
}

// qmpStatus asks a QEMU's monitor for its run state.
func qmpStatus(sock string) (string, error) {
	ret, err := qmp(sock, "query-status")
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(ret, &st)
	return st.Status, err
}

// watchArgv scans every process's argv and environment until stop, and
// counts the ipmitool processes it saw.
func watchArgv(secret string, stop <-chan struct{}) (seen *atomic.Int64, leaks func() []string) {
	seen = &atomic.Int64{}
	var mu sync.Mutex
	var found []string
	counted := map[string]bool{}
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			ents, _ := os.ReadDir("/proc")
			for _, e := range ents {
				if _, err := strconv.Atoi(e.Name()); err != nil {
					continue
				}
				cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
				environ, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
				if bytes.Contains(cmdline, []byte("ipmitool")) && bytes.Contains(cmdline, []byte("/dev/fd/3")) && !counted[e.Name()] {
					counted[e.Name()] = true
					seen.Add(1)
				}
				if bytes.Contains(cmdline, []byte(secret)) || bytes.Contains(environ, []byte(secret)) {
					mu.Lock()
					found = append(found, fmt.Sprintf("pid %s: %q", e.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
					mu.Unlock()
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return seen, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), found...) }
}

// TestIPMIPowersVM: inside a network namespace made by the test, ipmi_sim
// is the BMC of a QEMU VM (ipmi-bmc-extern + isa-ipmi-kcs; its chassis
// control starts and stops that QEMU), bcd site hosts bcx-ipmi, and bcgw
// drives it: bmc.power on (the VM runs, per QMP), status, bmc.bootDevice
// pxe (the BMC holds it), bmc.inspect, bmc.power off (the QEMU process is
// gone). The password is in no argv and no log.
func TestIPMIPowersVM(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	need(t, "qemu-system-x86_64", err)
	if os.Geteuid() != 0 {
		need(t, "root (network namespaces)", fmt.Errorf("not root"))
	}
	ipmisim.Need(t)
	repo := repoRoot(t)
	bin := buildBins(t, repo)
	plugins := t.TempDir()
	b := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(plugins, "bcx-ipmi"), "./cmd/bcx-ipmi")
	b.Dir, b.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("go build bcx-ipmi: %v\n%s", err, out)
	}
	plugin, _ := os.ReadFile(filepath.Join(plugins, "bcx-ipmi"))
	pins := fmt.Sprintf("%s  bcx-ipmi\n", sha256Hex(plugin))
	if err := os.WriteFile(filepath.Join(plugins, bcx.PinsFile), []byte(pins), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := newNetns(t)
	bmcAddr := pxeBridgeIP + ":623"

	// The BMC: its chassis control powers a QEMU VM on and off; the VM's
	// BMC device talks to ipmi_sim's serial port.
	qemuCmd := strings.Join([]string{qemu, "-machine", "pc", "-accel", accel(t), "-m", "128", "-smp", "1", "-nodefaults",
		"-display", "none", "-no-reboot", "-daemonize", "-pidfile", "$PWD/qemu.pid",
		"-qmp", "unix:$PWD/qmp.sock,server=on,wait=off", "-serial", "file:$PWD/console.log",
		"-chardev", "socket,id=ipmi0,host=127.0.0.1,port=9002,reconnect=2",
		"-device", "ipmi-bmc-extern,chardev=ipmi0,id=bmc0", "-device", "isa-ipmi-kcs,bmc=bmc0"}, " ")
	sim := ipmisim.Start(t, ipmisim.Options{
		Addr: bmcAddr, Password: ipmiQEMUPassword, SerialPort: 9002,
		PowerOn:     "test -f qemu.pid && kill -0 $(cat qemu.pid) || " + qemuCmd,
		PowerOff:    "if [ -f qemu.pid ]; then kill $(cat qemu.pid); rm -f qemu.pid; fi",
		PowerStatus: "test -f qemu.pid && kill -0 $(cat qemu.pid)",
		Command: func(argv ...string) *exec.Cmd {
			return ns.cmd(context.Background(), argv[0], argv[1:]...)
		},
	})
	qmpSock := filepath.Join(sim.Dir, "qmp.sock")
	qemuPID := func() int {
		b, err := os.ReadFile(filepath.Join(sim.Dir, "qemu.pid"))
		if err != nil {
			return 0
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return pid
	}
	t.Cleanup(func() {
		if pid := qemuPID(); pid != 0 {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
			}
		}
	})

	gwDir := filepath.Join(t.TempDir(), "gw")
	gw := ns.start(t, nil, filepath.Join(bin, "bcgw"), "serve", "--data-dir", gwDir, "--listen", pxeBridgeIP+":8443", "--heartbeat", "1s")
	waitFor(t, "bcgw", 30*time.Second, func() bool { return strings.Contains(gw.String(), `"msg":"bcgw serving"`) })
	bcgw := func(stdin string, args ...string) (string, error) {
		c := exec.Command(filepath.Join(bin, "bcgw"), append(args, "--data-dir", gwDir)...)
		c.Stdin = strings.NewReader(stdin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	must := func(out string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("bcgw: %v\n%s", err, out)
		}
		return out
	}
	tok := strings.TrimSpace(must(bcgw("", "token", "create", "--role", "site", "--site", "ipmi")))
	siteDir := filepath.Join(t.TempDir(), "site")
	cfgPath := filepath.Join(siteDir, "config.toml")
	join := ns.cmd(context.Background(), filepath.Join(bin, "bcd-site"), append([]string{"join", "--role", "site", "--config", cfgPath,
		"--data-dir", filepath.Join(siteDir, "data"), "--server", "https://" + pxeBridgeIP + ":8443"}, strings.Fields(must(bcgw("", "well-known", "--pins")))...)...)
	join.Stdin = strings.NewReader(tok + "\n")
	if out, err := join.CombinedOutput(); err != nil {
		t.Fatalf("bcd join: %v\n%s", err, out)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SocketPath = filepath.Join(siteDir, "run", "bcd.sock")
	cfg.Site.BMCNetworks = []string{"10.77.0.0/24"}
	cfg.Plugins.Dir = plugins
	cb, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(cfgPath, cb, 0o600)
	site := ns.start(t, nil, filepath.Join(bin, "bcd-site"), "site", "--config", cfgPath)
	var siteID string
	waitFor(t, "the site connected", 60*time.Second, func() bool {
		var nodes []struct {
			ID        string
			Connected bool
		}
		out, _ := bcgw("", "nodes", "--json")
		json.Unmarshal([]byte(out), &nodes)
		for _, n := range nodes {
			if n.Connected {
				siteID = n.ID
				return true
			}
		}
		return false
	})
	if !strings.Contains(site.String(), `"msg":"plugin started"`) || !strings.Contains(site.String(), `"driver":"ipmi"`) {
		t.Fatalf("bcx-ipmi did not start in bcd site:\n%s", site.String())
	}
	must(bcgw(ipmiQEMUPassword+"\n", "bmc-credentials", "--address", bmcAddr, "--username", sim.Username))

	stop := make(chan struct{})
	seen, leaks := watchArgv(ipmiQEMUPassword, stop)
	defer close(stop)
	bmcJSON := fmt.Sprintf(`{"address":%q,"driver":"ipmi","options":{"cipher_suite":3}}`, bmcAddr)
	type result struct {
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
		Error  string          `json:"error"`
	}
	runKind := func(kind, body string) result {
		t.Helper()
		start := time.Now()
		out, err := bcgw("", "run", siteID, kind, "--body", body, "--wait", "--timeout", "120s")
		var r result
		if i := strings.Index(out, "{"); i >= 0 {
			json.Unmarshal([]byte(out[i:]), &r)
		}
		var compact bytes.Buffer
		if json.Compact(&compact, r.Output) == nil {
			r.Output = compact.Bytes()
		}
		if err != nil || r.Status != "SUCCEEDED" {
			t.Fatalf("%s %s: %v\n%s\nsite:\n%s", kind, body, err, out, site.String())
		}
		t.Logf("%s %s: %s in %v", kind, body, r.Output, time.Since(start).Round(time.Millisecond))
		return r
	}

	if s, err := qmpStatus(qmpSock); err == nil {
		t.Fatalf("a VM is running before power on (%s)", s)
	}
	r := runKind("bmc.power", `{"bmc":`+bmcJSON+`,"action":"on"}`)
	if !strings.Contains(string(r.Output), `"power_state":"On"`) {
		t.Fatalf("power on: %s", r.Output)
	}
	var status string
	simLog := func() string {
		b, _ := os.ReadFile(filepath.Join(sim.Dir, "power.log"))
		ents, _ := os.ReadDir(sim.Dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		pidb, _ := os.ReadFile(filepath.Join(sim.Dir, "qemu.pid"))
		return fmt.Sprintf("files %v, qemu.pid %q\nchassis control:\n%s\nipmi_sim:\n%s", names, pidb, b, sim.Output())
	}
	for end := time.Now().Add(30 * time.Second); status != "running"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("QEMU is not running per QMP (%q)\n%s", status, simLog())
		}
		status, _ = qmpStatus(qmpSock)
	}
	pid := qemuPID()
	// The VM's BMC device is connected to ipmi_sim's serial interface.
	var chardev string
	for end := time.Now().Add(30 * time.Second); !strings.Contains(chardev, "<-> 127.0.0.1:9002"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the VM's ipmi-bmc-extern did not connect to ipmi_sim: %s\n%s", chardev, simLog())
		}
		ret, _ := qmp(qmpSock, "query-chardev")
		chardev = string(ret)
	}
	t.Logf("the VM runs: QEMU pid %d, QMP query-status %q, its BMC link connected", pid, status)
	if r := runKind("bmc.power", `{"bmc":`+bmcJSON+`,"action":"status"}`); !strings.Contains(string(r.Output), `"power_state":"On"`) {
		t.Fatalf("status: %s", r.Output)
	}
	if r := runKind("bmc.bootDevice", `{"bmc":`+bmcJSON+`,"device":"pxe","once":true}`); !strings.Contains(string(r.Output), `"target":"Pxe"`) {
		t.Fatalf("boot device: %s", r.Output)
	}
	if sim.Boot() != "pxe" {
		t.Fatalf("the BMC holds boot device %q, want pxe", sim.Boot())
	}
	if out, err := sim.Ipmitool(context.Background(), "chassis", "bootparam", "get", "5"); err != nil || !strings.Contains(out, "Force PXE") {
		t.Fatalf("the BMC's own boot flags: %v\n%s", err, out)
	}
	if r := runKind("bmc.inspect", `{"bmc":`+bmcJSON+`}`); !strings.Contains(string(r.Output), ipmisim.UUID) || !strings.Contains(string(r.Output), ipmisim.SensorName) {
		t.Fatalf("inspect: %s", r.Output)
	}
	if status, _ = qmpStatus(qmpSock); status != "running" {
		t.Fatalf("the VM stopped running: %q", status)
	}
	r = runKind("bmc.power", `{"bmc":`+bmcJSON+`,"action":"off"}`)
	if !strings.Contains(string(r.Output), `"power_state":"Off"`) {
		t.Fatalf("power off: %s", r.Output)
	}
	waitFor(t, "the QEMU process gone", 30*time.Second, func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err)
	})
	if _, err := qmpStatus(qmpSock); err == nil {
		t.Fatal("QMP still answers after power off")
	}
	if r := runKind("bmc.power", `{"bmc":`+bmcJSON+`,"action":"status"}`); !strings.Contains(string(r.Output), `"power_state":"Off"`) {
		t.Fatalf("status after off: %s", r.Output)
	}

	// The password: in no argv or environment while ipmitool ran (the
	// watcher saw ipmitool itself), and in no log of ours.
	if l := leaks(); len(l) != 0 {
		t.Fatalf("the BMC password is in a process's argv or environment:\n%s", strings.Join(l, "\n"))
	}
	if seen.Load() == 0 {
		t.Fatal("the argv watcher never saw an ipmitool run, so it proves nothing")
	}
	for name, log := range map[string]string{"bcd site": site.String(), "bcgw": gw.String()} {
		if strings.Contains(log, ipmiQEMUPassword) {
			t.Fatalf("the BMC password is in %s's log", name)
		}
	}
	t.Logf("argv watcher: %d ipmitool processes seen, none with the password in argv or environment", seen.Load())
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
