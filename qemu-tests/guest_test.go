package qemutests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// guest is a booted systemd guest of the systemd tier: Debian's kernel,
// systemd as PID 1, a copy of the cached root (guestroot_test.go) on a
// virtio disk, eth0 on the bridge of a network namespace the test made,
// the serial console read by the test, and the test's agent
// (qemu-tests/guestagent) on a virtio-serial port through which Run and
// Copy work. Tests of one group share one guest: boot it once with
// bootGuest and run steps on it; Reboot keeps the disk.
type guest struct {
	t          *testing.T
	qemu       string
	ns         *netns
	img        guestImage
	disk       string // this guest's copy of the root image
	diskFormat string
	data       string // the data disk holding the agent
	dir        string
	boots      int
	BootDur    time.Duration // the last boot, QEMU start to the agent's hello
	// loaderArgs are the kernel arguments the guest's boot loader
	// configuration adds (loaderArgsFromGrub), read before each reboot.
	loaderArgs []string

	cmd    *exec.Cmd
	exited chan struct{}

	mu      sync.Mutex
	console []line
	conn    net.Conn
	enc     *json.Encoder
	nextID  int
	pending map[int]chan agentResponse
	hello   chan string

	files     map[string][]byte // what serve offers, by URL path
	filesAddr string
	nextFile  int
}

type agentRequest struct {
	ID        int    `json:"id"`
	Op        string `json:"op"`
	Cmd       string `json:"cmd,omitempty"`
	TimeoutMS int    `json:"timeoutMs,omitempty"`
	Path      string `json:"path,omitempty"`
	Mode      uint32 `json:"mode,omitempty"`
	Data      []byte `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

type agentResponse struct {
	ID     int    `json:"id"`
	Hello  string `json:"hello,omitempty"`
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	Exit   int    `json:"exit"`
	Error  string `json:"error,omitempty"`
}

// Deadlines under TCG on a loaded 2-core machine, about 2-3x what was
// measured (README.md): a boot took 4m48s at load 30-34.
const (
	guestBootDeadline = 10 * time.Minute
	guestRunDeadline  = 3 * time.Minute
)

// bootGuest builds (or takes from the cache) the guest, copies its disk,
// and boots it in ns (whose tap0 it uses); it returns once the agent
// answers. The guest is powered off when the test ends.
func bootGuest(t *testing.T, ns *netns) *guest {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	need(t, "qemu-system-x86_64", err)
	img := cachedGuest(t)
	g := &guest{t: t, qemu: qemu, ns: ns, img: img, dir: t.TempDir()}
	start := time.Now()
	// This guest's disk: a qcow2 overlay on the cached image (instant),
	// or a sparse copy of it without qemu-img.
	if qemuImg, err := exec.LookPath("qemu-img"); err == nil {
		g.disk, g.diskFormat = filepath.Join(g.dir, "root.qcow2"), "qcow2"
		if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", img.disk, g.disk).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v\n%s", err, out)
		}
	} else {
		g.disk, g.diskFormat = filepath.Join(g.dir, "root.img"), "raw"
		if out, err := exec.Command("cp", "--sparse=always", img.disk, g.disk).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v\n%s", img.disk, err, out)
		}
	}
	t.Logf("guest: root disk (%s) made in %s", g.diskFormat, time.Since(start).Round(10*time.Millisecond))
	// The data disk: the agent, built now from this tree.
	dataDir := filepath.Join(g.dir, "data")
	os.MkdirAll(dataDir, 0o755)
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dataDir, "guestagent"), "./qemu-tests/guestagent")
	build.Dir, build.Env = repoRoot(t), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./qemu-tests/guestagent: %v\n%s", err, out)
	}
	g.data = filepath.Join(g.dir, "data.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "BCDTEST", "-d", dataDir, g.data, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v\n%s", g.data, err, out)
	}
	t.Cleanup(g.stop)
	g.boot()
	return g
}

// boot starts QEMU on the guest's disks and waits for the agent.
func (g *guest) boot() {
	t := g.t
	t.Helper()
	g.boots++
	sock := filepath.Join(g.dir, fmt.Sprintf("agent%d.sock", g.boots))
	args := []string{
		"-machine", "q35", "-accel", accel(t), "-cpu", "max", "-smp", "2", "-m", "1024",
		"-nographic", "-no-reboot",
		"-kernel", g.img.bootKernel(), "-initrd", g.img.initrd,
		"-append", strings.Join(append([]string{"root=/dev/vda rw console=ttyS0 panic=-1 net.ifnames=0 quiet systemd.show_status=1"}, g.loaderArgs...), " "),
		"-drive", "file=" + g.disk + ",if=virtio,format=" + g.diskFormat + ",cache=unsafe",
		"-drive", "file=" + g.data + ",if=virtio,format=raw,readonly=on",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:78:00:02",
		"-device", "virtio-rng-pci",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=agent,path=" + sock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=bcd.agent",
	}
	g.cmd = g.ns.cmd(context.Background(), g.qemu, args...)
	stdout, err := g.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	g.cmd.Stderr = g.cmd.Stdout
	t.Logf("guest: boot %d: %s %s", g.boots, g.qemu, strings.Join(args, " "))
	start := time.Now()
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	g.console = nil
	g.mu.Unlock()
	g.exited = make(chan struct{})
	g.hello = make(chan string, 1)
	g.pending = map[int]chan agentResponse{}
	go func() {
		s := bufio.NewScanner(stdout)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			g.mu.Lock()
			g.console = append(g.console, line{time.Since(start), strings.TrimRight(s.Text(), "\r")})
			g.mu.Unlock()
		}
		g.cmd.Wait()
		close(g.exited)
	}()
	// QEMU makes the socket before the guest runs.
	var conn net.Conn
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
		select {
		case <-g.exited:
			g.dumpConsole()
			t.Fatalf("QEMU exited at start: %v", g.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU's agent socket %s: %v", sock, err)
		}
	}
	g.mu.Lock()
	g.conn, g.enc = conn, json.NewEncoder(conn)
	g.mu.Unlock()
	go g.read(conn)
	select {
	case id := <-g.hello:
		g.BootDur = time.Since(start)
		t.Logf("guest: boot %d: agent up after %s (boot id %s; %s)", g.boots, g.BootDur.Round(100*time.Millisecond), id, g.marks())
	case <-g.exited:
		g.dumpConsole()
		t.Fatalf("QEMU exited before the guest's agent answered: %v", g.cmd.ProcessState)
	case <-time.After(guestBootDeadline):
		g.dumpConsole()
		t.Fatalf("the guest's agent did not answer within %v of QEMU starting", guestBootDeadline)
	}
}

// guestMarks are console lines whose first time in a boot is logged.
var guestMarks = []struct{ name, substr string }{
	{"systemd", "Welcome to "},
	{"udevd", "Started systemd-udevd.serv"},
	{"agent", "Started bcd-test-agent.ser"},
	{"network", "Reached target network-online.target"},
}

var ansiRe = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// marks says when the boot's milestones showed on the console.
func (g *guest) marks() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, m := range guestMarks {
		for _, l := range g.console {
			if strings.Contains(ansiRe.ReplaceAllString(l.text, ""), m.substr) {
				out = append(out, fmt.Sprintf("%s %.1fs", m.name, l.at.Seconds()))
				break
			}
		}
	}
	return strings.Join(out, ", ")
}

func (g *guest) read(conn net.Conn) {
	s := bufio.NewScanner(conn)
	s.Buffer(make([]byte, 1<<20), 256<<20)
	for s.Scan() {
		var r agentResponse
		if err := json.Unmarshal(s.Bytes(), &r); err != nil {
			continue // the port may carry a partial line from a previous agent
		}
		if r.Hello != "" {
			select {
			case g.hello <- r.Hello:
			default:
			}
			continue
		}
		g.mu.Lock()
		ch := g.pending[r.ID]
		delete(g.pending, r.ID)
		g.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	// The connection is gone: whatever waits gets an error.
	g.mu.Lock()
	for id, ch := range g.pending {
		ch <- agentResponse{ID: id, Exit: -1, Error: "the agent's connection closed"}
		delete(g.pending, id)
	}
	g.mu.Unlock()
}

func (g *guest) call(req agentRequest, timeout time.Duration) (agentResponse, error) {
	ch := make(chan agentResponse, 1)
	g.mu.Lock()
	g.nextID++
	req.ID = g.nextID
	g.pending[req.ID] = ch
	err := g.enc.Encode(req)
	g.mu.Unlock()
	if err != nil {
		return agentResponse{}, fmt.Errorf("to the guest's agent: %w", err)
	}
	select {
	case r := <-ch:
		if r.Error != "" {
			return r, errors.New(r.Error)
		}
		return r, nil
	case <-time.After(timeout + 10*time.Second):
		return agentResponse{}, fmt.Errorf("the guest's agent did not answer within %v", timeout+10*time.Second)
	}
}

// Run runs a shell command line in the guest as root and returns its
// standard output, exit status and any error running it (its standard
// error is appended to the error when it exits non-zero).
func (g *guest) Run(cmdline string) (string, int, error) {
	return g.RunTimeout(cmdline, guestRunDeadline)
}

func (g *guest) RunTimeout(cmdline string, timeout time.Duration) (string, int, error) {
	start := time.Now()
	r, err := g.call(agentRequest{Op: "run", Cmd: cmdline, TimeoutMS: int(timeout / time.Millisecond)}, timeout)
	if took := time.Since(start); took > 5*time.Second {
		g.t.Logf("guest: %q took %s", tail(cmdline, 120), took.Round(100*time.Millisecond))
	}
	if err == nil && r.Exit != 0 {
		err = fmt.Errorf("exit status %d: %s", r.Exit, strings.TrimSpace(string(r.Stderr)))
	}
	return string(r.Stdout), r.Exit, err
}

// Must runs a command that has to succeed and returns its standard output.
func (g *guest) Must(cmdline string) string {
	g.t.Helper()
	return g.MustTimeout(cmdline, guestRunDeadline)
}

// MustTimeout is Must with its own deadline, for long commands (apt,
// dpkg: each daemon-reload of theirs took 20-28 s in the guest at load
// 15-23, and a purge 3 min at load 30).
func (g *guest) MustTimeout(cmdline string, timeout time.Duration) string {
	g.t.Helper()
	out, _, err := g.RunTimeout(cmdline, timeout)
	if err != nil {
		g.t.Fatalf("in the guest: %s: %v\n%s", cmdline, err, out)
	}
	return out
}

// Copy writes a local file into the guest at path with mode. A large
// file goes over the guest's network from an HTTP server the test runs on
// the host side of the namespace (the serial port moves about 150 KB/s
// under TCG on a loaded machine); a small one, or one copied before the
// guest's network is up, goes through the agent's port.
func (g *guest) Copy(local, path string, mode os.FileMode) error {
	b, err := os.ReadFile(local)
	if err != nil {
		return err
	}
	if len(b) < 256<<10 {
		return g.Put(path, b, mode)
	}
	start := time.Now()
	url := g.serve(b)
	if _, err := g.call(agentRequest{Op: "fetch", URL: url, Path: path, Mode: uint32(mode.Perm())}, 5*time.Minute); err != nil {
		g.t.Logf("guest: fetching %s from %s: %v; copying it through the agent's port", path, url, err)
		return g.Put(path, b, mode)
	}
	g.t.Logf("guest: fetched %s (%d bytes) in %s", path, len(b), time.Since(start).Round(10*time.Millisecond))
	return nil
}

// serve offers data once over HTTP on the host side of the guest's
// network and returns its URL.
func (g *guest) serve(data []byte) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.files == nil {
		g.files = map[string][]byte{}
		ln := g.ns.listen(g.t, guestHostIP+":0")
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.mu.Lock()
			b, ok := g.files[r.URL.Path]
			g.mu.Unlock()
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Write(b)
		})}
		go srv.Serve(ln)
		g.t.Cleanup(func() { srv.Close() })
		g.filesAddr = ln.Addr().String()
	}
	g.nextFile++
	p := fmt.Sprintf("/f%d", g.nextFile)
	g.files[p] = data
	return "http://" + g.filesAddr + p
}

// Put writes data into the guest at path with mode (atomically).
func (g *guest) Put(path string, data []byte, mode os.FileMode) error {
	start := time.Now()
	defer func() {
		g.t.Logf("guest: put %s (%d bytes) in %s", path, len(data), time.Since(start).Round(10*time.Millisecond))
	}()
	_, err := g.call(agentRequest{Op: "put", Path: path, Mode: uint32(mode.Perm()), Data: data}, time.Minute)
	if err != nil {
		return fmt.Errorf("copying into the guest's %s: %w", path, err)
	}
	return nil
}

// Show reads a unit's properties back from the guest's systemd
// (systemctl show -p A,B UNIT), e.g. a slice's CPUQuotaPerSecUSec,
// AllowedCPUs and MemoryMax.
func (g *guest) Show(unit string, props ...string) map[string]string {
	g.t.Helper()
	out := g.Must("systemctl show -p " + strings.Join(props, ",") + " " + shellQuote(unit))
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// SliceLimits reads back what systemd holds for a slice (or any unit):
// its CPU quota, CPU set and memory limit, and whether it is active.
func (g *guest) SliceLimits(unit string) map[string]string {
	g.t.Helper()
	return g.Show(unit, "CPUQuotaPerSecUSec", "AllowedCPUs", "MemoryMax", "ActiveState")
}

// WaitState waits until the unit's ActiveState is state (e.g. "failed"
// for a unit that crash-loops into its start limit).
func (g *guest) WaitState(unit, state string, within time.Duration) map[string]string {
	g.t.Helper()
	deadline := time.Now().Add(within)
	for {
		p := g.Show(unit, "ActiveState", "SubState", "Result", "NRestarts")
		if p["ActiveState"] == state {
			return p
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("%s is %v after %v, want ActiveState=%s", unit, p, within, state)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// WaitActive waits until systemctl is-active UNIT says active.
func (g *guest) WaitActive(unit string, within time.Duration) {
	g.t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, _, _ := g.Run("systemctl is-active " + shellQuote(unit))
		if strings.TrimSpace(out) == "active" {
			return
		}
		if time.Now().After(deadline) {
			st, _, _ := g.Run("systemctl status --no-pager -l " + shellQuote(unit) + "; journalctl --no-pager -n 50 -u " + shellQuote(unit))
			g.t.Fatalf("%s is %q after %v:\n%s", unit, strings.TrimSpace(out), within, st)
		}
		time.Sleep(time.Second)
	}
}

// Reboot reboots the guest (systemctl reboot: a clean shutdown; QEMU runs
// with -no-reboot, so it exits and the same disks boot again) and returns
// once the agent of the new boot answers.
func (g *guest) Reboot() {
	g.t.Helper()
	g.readLoaderArgs()
	g.shutdown("reboot")
	g.boot()
}

// RebootBy reboots the guest by what trigger does inside it (node.reboot
// through bcd): it waits for QEMU to exit (-no-reboot) and boots the same
// disks again, with the kernel arguments of the guest's boot loader.
func (g *guest) RebootBy(trigger func()) {
	g.t.Helper()
	g.readLoaderArgs()
	trigger()
	select {
	case <-g.exited:
	case <-time.After(3 * time.Minute):
		g.dumpConsole()
		g.t.Fatalf("the guest did not go down within 3m")
	}
	g.conn.Close()
	g.boot()
}

// readLoaderArgs stands in for the firmware's boot loader: QEMU boots the
// kernel directly, so the arguments GRUB's configuration in the guest
// renders for its first entry (update-grub's /boot/grub/grub.cfg, which
// the host units' drop-ins feed) are added to the harness's own line.
// Without a grub.cfg, none.
func (g *guest) readLoaderArgs() {
	g.t.Helper()
	out, code, _ := g.Run("cat /boot/grub/grub.cfg 2>/dev/null")
	g.loaderArgs = nil
	if code != 0 {
		return
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "linux" || !strings.Contains(f[1], "vmlinuz") {
			continue
		}
		for _, a := range f[2:] {
			if strings.HasPrefix(a, "root=") || strings.HasPrefix(a, "BOOT_IMAGE=") || a == "ro" || a == "rw" || a == "quiet" {
				continue
			}
			g.loaderArgs = append(g.loaderArgs, a)
		}
		g.t.Logf("guest: the boot loader's first entry adds %q", g.loaderArgs)
		return
	}
}

func (g *guest) shutdown(verb string) {
	g.t.Helper()
	g.call(agentRequest{Op: "run", Cmd: "systemctl " + verb, TimeoutMS: 5000}, 5*time.Second)
	select {
	case <-g.exited:
	case <-time.After(2 * time.Minute):
		g.dumpConsole()
		g.t.Fatalf("the guest did not go down within 2m of systemctl %s", verb)
	}
	g.conn.Close()
}

// stop powers the guest off, or kills QEMU when it does not go.
func (g *guest) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	select {
	case <-g.exited:
	default:
		g.call(agentRequest{Op: "run", Cmd: "systemctl poweroff", TimeoutMS: 5000}, 5*time.Second)
		select {
		case <-g.exited:
		case <-time.After(time.Minute):
			g.cmd.Process.Kill()
			<-g.exited
		}
	}
	if g.conn != nil {
		g.conn.Close()
	}
	if g.t.Failed() {
		g.dumpConsole()
	}
}

func (g *guest) dumpConsole() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var s strings.Builder
	for _, l := range g.console {
		fmt.Fprintf(&s, "%7.2fs %s\n", l.at.Seconds(), l.text)
	}
	g.t.Logf("guest serial console (boot %d):\n%s", g.boots, tail(s.String(), 20000))
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

var errNotRoot = errors.New("not root")
