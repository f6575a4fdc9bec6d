package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func rssKiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

// memory is where a process's resident memory is, from /proc/PID/smaps
// (KiB): the binary's code (text), its read-only data (rodata: also the
// pclntab the runtime reads for stacks), its data and bss, and the
// anonymous memory (what it takes from the machine: the Go heap, stacks,
// the data pages written), beside the binary's size on disk.
type memory struct {
	RSS, Anon, Text, Rodata, Data, AnonMaps, Other, Binary float64
}

func (m memory) String() string {
	return fmt.Sprintf("RSS %.0f KiB = text %.0f + rodata %.0f + data %.0f + anonymous mappings (bss, heap, stacks) %.0f + other %.0f; anonymous %.0f KiB; binary %.0f KiB",
		m.RSS, m.Text, m.Rodata, m.Data, m.AnonMaps, m.Other, m.Anon, m.Binary)
}

func memoryOf(pid int) memory {
	var m memory
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if st, err := os.Stat(exe); err == nil {
		m.Binary = float64(st.Size()) / 1024
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return m
	}
	var perms, path string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's header
			perms, path = f[1], ""
			if len(f) >= 6 {
				path = f[5]
			}
			continue
		}
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "Rss:":
			m.RSS += v
			switch {
			case path == exe && strings.HasPrefix(perms, "r-x"):
				m.Text += v
			case path == exe && strings.HasPrefix(perms, "r--"):
				m.Rodata += v
			case path == exe:
				m.Data += v
			case path == "" || path == "[heap]" || path == "[stack]":
				m.AnonMaps += v
			default:
				m.Other += v
			}
		case "Anonymous:":
			m.Anon += v
		}
	}
	return m
}

// measuredTrips is how many round trips a measured p99 is taken from: at
// least 3,000, so that p99 is not one of the few worst and p99.9 means
// something (3 trips above it).
const measuredTrips = 3000

// latency is a round trip's distribution.
type latency struct{ p50, p99, p999, max time.Duration }

// roundTrips sends n agent.ping commands one after another to random
// connected nodes and returns the round trip's p50, p99, p99.9 and max.
func roundTrips(b *testing.B, admin *adminapi.Client, ids []string, n int) latency {
	var d []time.Duration
	ctx := context.Background()
	for i := range n {
		start := time.Now()
		c, err := admin.Send(ctx, adminapi.CommandRequest{Node: ids[i%len(ids)], Kind: "agent.ping"})
		if err != nil {
			b.Fatal(err)
		}
		for c.State != "done" {
			if c, err = admin.Command(ctx, c.ID, 30*time.Second); err != nil {
				b.Fatal(err)
			}
		}
		d = append(d, time.Since(start))
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return latency{p50: d[len(d)/2], p99: d[len(d)*99/100], p999: d[len(d)*999/1000], max: d[len(d)-1]}
}

var joinedInRe = regexp.MustCompile(`joined (\d+) machines in (\S+)`)

// simRun starts bcd sim with n machines, waits until all are connected,
// and returns the process, join rate and the node ids.
func simRun(b *testing.B, l *lab, g *gw, n int, name string) (*proc, float64, []string) {
	tok := l.token(g, "--uses", fmt.Sprint(n))
	cfg := l.simConfig(g, name)
	p := l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "1")
	end := time.Now().Add(10 * time.Minute)
	var ids []string
	for time.Now().Before(end) {
		ids = ids[:0]
		for _, x := range l.nodes(g) {
			if x.Connected {
				ids = append(ids, x.ID)
			}
		}
		if len(ids) >= n {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	m := joinedInRe.FindStringSubmatch(p.stdout.String())
	if m == nil {
		b.Fatalf("bcd sim printed %q", p.stdout.String())
	}
	d, _ := time.ParseDuration(m[2])
	joined, _ := strconv.Atoi(m[1])
	return p, float64(joined) / d.Seconds(), ids
}

// BenchmarkSim prints, for bcd sim with 1,000 agents against one bcgw:
// joins per second, resident memory per agent and the p50/p99 round trip
// of a control command; each next to its reference measured in the same
// run with a single agent (BCD_SIM_NODES overrides 1,000).
func BenchmarkSim(b *testing.B) {
	n := 1000
	if v := os.Getenv("BCD_SIM_NODES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	l := newLab(b)
	ctx := context.Background()

	// Reference: one agent.
	g1 := l.startGateway(filepath.Join(l.root, "gw1"), "127.0.0.1:0")
	admin1 := adminapi.NewClient(g1.dataDir, "", "")
	p1, joins1, ids1 := simRun(b, l, g1, 1, "sim1")
	time.Sleep(time.Second)
	rss1 := rssKiB(p1.cmd.Process.Pid)
	ref := roundTrips(b, admin1, ids1, 500)
	p50r, p99r := ref.p50, ref.p99
	p1.signal(syscall.SIGTERM)
	p1.wait(b, time.Minute)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	admin := adminapi.NewClient(g.dataDir, "", "")
	p, joins, ids := simRun(b, l, g, n, "sim")
	if len(ids) < n {
		b.Fatalf("%d of %d agents connected", len(ids), n)
	}
	time.Sleep(2 * time.Second)
	rss := rssKiB(p.cmd.Process.Pid)
	gwRSS := rssKiB(g.cmd.Process.Pid)
	lat := roundTrips(b, admin, ids, measuredTrips)
	p50, p99 := lat.p50, lat.p99
	_ = ctx
	p.signal(syscall.SIGTERM)
	p.wait(b, 2*time.Minute)

	fmt.Printf("bcd sim with %d agents against one bcgw on %d cores:\n", n, numCPU())
	fmt.Printf("  joins/s                %8.1f   (one agent alone: %.1f)\n", joins, joins1)
	fmt.Printf("  RSS per agent          %8.1f KiB   (a one-agent bcd sim process: %.0f KiB)\n", rss/float64(n), rss1)
	fmt.Printf("  bcgw RSS               %8.0f KiB\n", gwRSS)
	fmt.Printf("  control round trip p50 %8s   (one agent alone: %s)\n", p50.Round(10*time.Microsecond), p50r.Round(10*time.Microsecond))
	fmt.Printf("  control round trip p99 %8s   (one agent alone: %s)\n", p99.Round(10*time.Microsecond), p99r.Round(10*time.Microsecond))
	fmt.Printf("  p99.9 %s, max %s of %d round trips\n", lat.p999.Round(10*time.Microsecond), lat.max.Round(10*time.Microsecond), measuredTrips)
	b.ReportMetric(joins, "joins/s")
	b.ReportMetric(rss/float64(n), "KiB/agent")
	b.ReportMetric(float64(p50.Microseconds()), "p50-us")
	b.ReportMetric(float64(p99.Microseconds()), "p99-us")
	b.ReportMetric(float64(lat.p999.Microseconds()), "p99.9-us")
	b.ReportMetric(float64(lat.max.Microseconds()), "max-us")
	// The references, for make bench's table (cmd/benchtable).
	b.ReportMetric(joins1, "ref-joins/s")
	b.ReportMetric(rss1, "ref-KiB")
	b.ReportMetric(float64(p99r.Microseconds()), "ref-p99-us")
}

// BenchmarkIdleNode is an idle bcd node (fakehw build) joined to bcgw:
// its resident memory and the CPU it uses over 60 s ($BCD_IDLE_SECONDS),
// next to a sleep process started beside it as the floor, and beside it
// a second idle node with a telemetry section exporting every 10 s
// ($BCD_TELEMETRY_INTERVAL seconds) to the test collector (tools/otelcol).
func BenchmarkIdleNode(b *testing.B) {
	window := 60 * time.Second
	if v := os.Getenv("BCD_IDLE_SECONDS"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil || s < 1 {
			b.Fatalf("BCD_IDLE_SECONDS=%q", v)
		}
		window = time.Duration(s) * time.Second
	}
	interval := 10
	if v := os.Getenv("BCD_TELEMETRY_INTERVAL"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil || s < 1 {
			b.Fatalf("BCD_TELEMETRY_INTERVAL=%q", v)
		}
		interval = s
	}
	col := otelcol(b)
	l := newLab(b)
	ca, certFile, keyFile := collectorTLS(b, l.root)
	addr := freeAddr(b)
	l.startCollector(col, addr, certFile, keyFile)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "2")
	cfg, id := l.joinNode(g, "n", tok, "node")
	telCfg, telID := l.joinNode(g, "t", tok, "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	telNode := l.start("bcd-node", "node", "--config", telCfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	l.waitNode(g, telID, "connected", func(n nodeView) bool { return n.Connected })
	spec, _ := json.Marshal(map[string]any{"telemetry": map[string]any{"endpoint": "https://" + addr, "interval_s": interval, "ca_pem": ca}})
	l.spec(g, "set", telID, string(spec))
	sleep := exec.Command("sleep", "3600")
	if err := sleep.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	// Idle is after the start: the first reports and exports are out, and
	// the agents have given back the pages only their start touched (20 s
	// after they started, components/agent/resident).
	time.Sleep(25 * time.Second)
	if st := nodeStatus(b, l, telCfg).Telemetry; st == nil || st.LastExport.IsZero() {
		b.Fatalf("the telemetry node has not exported: %+v", st)
	}
	np, tp, sp := node.cmd.Process.Pid, telNode.cmd.Process.Pid, sleep.Process.Pid
	n0, t0, s0 := procCPU(np), procCPU(tp), procCPU(sp)
	var nRSS, tRSS, sRSS float64
	var nMem memory // at the node's peak RSS
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(time.Second) {
		if m := memoryOf(np); m.RSS > nMem.RSS {
			nMem = m
		}
		nRSS, tRSS, sRSS = max(nRSS, rssKiB(np)), max(tRSS, rssKiB(tp)), max(sRSS, rssKiB(sp))
	}
	perMin := float64(time.Minute) / float64(window)
	ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) * perMin }
	nCPU, tCPU, sCPU := ms(procCPU(np)-n0), ms(procCPU(tp)-t0), ms(procCPU(sp)-s0)
	st := nodeStatus(b, l, telCfg).Telemetry
	fmt.Printf("idle bcd node (fakehw) over %s: peak RSS %.0f KiB, CPU %.0f ms/min   (a sleep process: %.0f KiB, %.0f ms/min)\n", window, nRSS, nCPU, sRSS, sCPU)
	fmt.Printf("idle bcd node (fakehw) with telemetry every %ds: peak RSS %.0f KiB, CPU %.0f ms/min   (telemetry off: %.0f KiB, %.0f ms/min; %d points exported, %d dropped)\n",
		interval, tRSS, tCPU, nRSS, nCPU, st.ExportedPoints, st.DroppedPoints)
	fmt.Printf("idle bcd node (fakehw), telemetry off, at its peak: %s\n", nMem)
	b.ReportMetric(nRSS, "node-KiB")
	b.ReportMetric(nMem.Anon, "node-anon-KiB")
	b.ReportMetric(nMem.Text+nMem.Rodata, "node-code-KiB")
	b.ReportMetric(nMem.Binary, "node-bin-KiB")
	b.ReportMetric(nCPU, "node-cpu-ms/min")
	b.ReportMetric(tRSS, "tel-node-KiB")
	b.ReportMetric(tCPU, "tel-node-cpu-ms/min")
	b.ReportMetric(sRSS, "sleep-KiB")
	b.ReportMetric(sCPU, "sleep-cpu-ms/min")
}

// freeAddr is a loopback address no one listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func numCPU() int { return runtime.NumCPU() }

// procCPU is a process's user+system CPU time so far.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name in parentheses: utime is the 14th and
	// stime the 15th field of the line, in clock ticks (100 a second).
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// procReadBytes is what a process read so far (/proc/PID/io rchar: every
// read syscall, the agents' TLS streams included).
func procReadBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkReporting prints what desired-state reporting costs with 1,000
// bcd sim agents against one bcgw (BCD_SIM_NODES overrides): the bytes
// bcgw reads per agent per minute and bcgw's CPU, once the agents are
// connected (a steady minute, scaled from a 30 s window) and from the
// first join until every agent is connected and has reported (the
// inventory goes out in full once), next to the same run without
// reporting (BCD_SIM_NO_REPORT: no health monitor, no inventory,
// conditions or pressure; heartbeats and generations still go out).
// Heartbeats are every 3 s here, so the 30 s window holds one whole
// cycle of 10 beats, one of which carries the inventory hashes.
func BenchmarkReporting(b *testing.B) {
	n := 1000
	if v := os.Getenv("BCD_SIM_NODES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	const window = 30 * time.Second
	type figures struct {
		startBytes, steadyBytes float64 // per agent (start) and per agent per minute (steady)
		startCPU, steadyCPU     time.Duration
		startTook               time.Duration
	}
	run := func(name string, env []string) figures {
		l := newLab(b)
		g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0", "--heartbeat", "3s")
		pid := g.cmd.Process.Pid
		bytes0, cpu0, t0 := procReadBytes(pid), procCPU(pid), time.Now()
		tok := l.token(g, "--uses", fmt.Sprint(n))
		cfg := l.simConfig(g, name)
		p := l.startStdin(tok+"\n", env, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "1")
		end := time.Now().Add(10 * time.Minute)
		for time.Now().Before(end) {
			c := 0
			for _, x := range l.nodes(g) {
				if x.Connected {
					c++
				}
			}
			if c >= n {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(5 * time.Second) // first reports and the inventory
		bytes1, cpu1, t1 := procReadBytes(pid), procCPU(pid), time.Now()
		time.Sleep(window)
		bytes2, cpu2 := procReadBytes(pid), procCPU(pid)
		p.signal(syscall.SIGTERM)
		p.wait(b, 2*time.Minute)
		scale := float64(time.Minute) / float64(window)
		return figures{
			startBytes: float64(bytes1-bytes0) / float64(n), steadyBytes: float64(bytes2-bytes1) / float64(n) * scale,
			startCPU: cpu1 - cpu0, steadyCPU: time.Duration(float64(cpu2-cpu1) * scale), startTook: t1.Sub(t0),
		}
	}
	ref := run("plain", []string{"BCD_SIM_NO_REPORT=1"})
	rep := run("reporting", nil)
	fmt.Printf("desired-state reporting with %d bcd sim agents against one bcgw on %d cores (heartbeat 3 s):\n", n, numCPU())
	fmt.Printf("  steady: bytes read by bcgw per agent per minute %8.0f   (without reporting: %.0f)\n", rep.steadyBytes, ref.steadyBytes)
	fmt.Printf("  steady: bcgw CPU per minute                     %8s   (without reporting: %s)\n", rep.steadyCPU.Round(time.Millisecond), ref.steadyCPU.Round(time.Millisecond))
	fmt.Printf("  start:  bytes read by bcgw per agent            %8.0f   (without reporting: %.0f)\n", rep.startBytes, ref.startBytes)
	fmt.Printf("  start:  bcgw CPU until all reported             %8s   (without reporting: %s; took %s and %s)\n",
		rep.startCPU.Round(time.Millisecond), ref.startCPU.Round(time.Millisecond), rep.startTook.Round(time.Second), ref.startTook.Round(time.Second))
	b.ReportMetric(rep.steadyBytes, "B/agent/min")
	b.ReportMetric(ref.steadyBytes, "ref-B/agent/min")
}
