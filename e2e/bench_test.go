package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
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

// roundTrips sends n agent.ping commands one after another to random
// connected nodes and returns p50 and p99 of the round trip.
func roundTrips(b *testing.B, admin *gateway.AdminClient, ids []string, n int) (time.Duration, time.Duration) {
	var d []time.Duration
	ctx := context.Background()
	for i := range n {
		start := time.Now()
		c, err := admin.Send(ctx, gateway.CommandRequest{Node: ids[i%len(ids)], Kind: "agent.ping"})
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
	return d[len(d)/2], d[len(d)*99/100]
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
	admin1 := gateway.NewAdminClient(g1.dataDir, "", "")
	p1, joins1, ids1 := simRun(b, l, g1, 1, "sim1")
	time.Sleep(time.Second)
	rss1 := rssKiB(p1.cmd.Process.Pid)
	p50r, p99r := roundTrips(b, admin1, ids1, 200)
	p1.signal(syscall.SIGTERM)
	p1.wait(b, time.Minute)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	admin := gateway.NewAdminClient(g.dataDir, "", "")
	p, joins, ids := simRun(b, l, g, n, "sim")
	if len(ids) < n {
		b.Fatalf("%d of %d agents connected", len(ids), n)
	}
	time.Sleep(2 * time.Second)
	rss := rssKiB(p.cmd.Process.Pid)
	gwRSS := rssKiB(g.cmd.Process.Pid)
	p50, p99 := roundTrips(b, admin, ids, 500)
	_ = ctx
	p.signal(syscall.SIGTERM)
	p.wait(b, 2*time.Minute)

	fmt.Printf("bcd sim with %d agents against one bcgw on %d cores:\n", n, numCPU())
	fmt.Printf("  joins/s                %8.1f   (one agent alone: %.1f)\n", joins, joins1)
	fmt.Printf("  RSS per agent          %8.1f KiB   (a one-agent bcd sim process: %.0f KiB)\n", rss/float64(n), rss1)
	fmt.Printf("  bcgw RSS               %8.0f KiB\n", gwRSS)
	fmt.Printf("  control round trip p50 %8s   (one agent alone: %s)\n", p50.Round(10*time.Microsecond), p50r.Round(10*time.Microsecond))
	fmt.Printf("  control round trip p99 %8s   (one agent alone: %s)\n", p99.Round(10*time.Microsecond), p99r.Round(10*time.Microsecond))
	b.ReportMetric(joins, "joins/s")
	b.ReportMetric(rss/float64(n), "KiB/agent")
	b.ReportMetric(float64(p50.Microseconds()), "p50-us")
	b.ReportMetric(float64(p99.Microseconds()), "p99-us")
}

func numCPU() int { return runtime.NumCPU() }
