package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
)

// scaleFigures are one BenchmarkScale run's figures.
type scaleFigures struct {
	n                  int
	joinsPerSec        float64
	connectTook        time.Duration // from the sim's start until every agent was connected
	p50, p99           time.Duration
	lat                latency // p50 and p99 again, p99.9 and max, of measuredTrips round trips
	gwRSS, simRSS      float64 // KiB: bcgw, and bcd sim with its child processes
	simProcs           int
	idleCPU            time.Duration // bcgw CPU per minute, idle
	pgWrites, pgCommit float64       // rows written and transactions committed a second, idle
}

// treeRSS is the resident memory of pid and its children (bcd sim's
// shards), in KiB, and how many processes that is.
func treeRSS(pid int) (float64, int) {
	total, n := rssKiB(pid), 1
	for _, child := range procPIDs() {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", child))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "PPid:" && f[1] == strconv.Itoa(pid) {
				total += rssKiB(child)
				n++
			}
		}
	}
	return total, n
}

// procPIDs lists the processes running now.
func procPIDs() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// pgWaits samples, every 500 ms until stop is called, what the active
// backends of url's database wait for (pg_stat_activity: "IO/WALSync",
// "Lock/object", "-" for running); stop returns each wait's count.
func pgWaits(ctx context.Context, url string) (stop func() map[string]int) {
	counts := map[string]int{}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		for {
			rows, err := conn.Query(ctx, `SELECT coalesce(wait_event_type || '/' || wait_event, '-') FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()`)
			if err == nil {
				for rows.Next() {
					var w string
					if rows.Scan(&w) == nil {
						counts[w]++
					}
				}
				rows.Close()
			}
			select {
			case <-done:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	return func() map[string]int {
		close(done)
		<-finished
		return counts
	}
}

// pgWrites reads the rows written and transactions committed so far in
// the database of url.
func pgWrites(ctx context.Context, url string) (rows, commits float64, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(ctx)
	// The statistics of this transaction are a snapshot; read fresh ones.
	_, _ = conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	err = conn.QueryRow(ctx, `SELECT tup_inserted + tup_updated + tup_deleted, xact_commit
		FROM pg_stat_database WHERE datname = current_database()`).Scan(&rows, &commits)
	return rows, commits, err
}

// BenchmarkScale: bcd sim agents joined to one bcgw on a durable
// PostgreSQL (a cluster the benchmark starts), at 10,000 agents
// (BCD_SCALE_NODES) next to 1,000 in the same run: the join rate, the p50
// and p99 round trip of a control command, bcgw's resident memory per
// session and its CPU while the agents are idle (heartbeats every 15 s),
// and what PostgreSQL writes a second then (rows and commits, over
// BCD_SCALE_IDLE_SECONDS, 60 by default). Agents not connected within
// BCD_SCALE_CONNECT_MINUTES (30) are left out and the count printed. Each agent is a real session
// over mTLS on loopback with its own identity, journal and status socket.
func BenchmarkScale(b *testing.B) {
	n := scaleEnv(b, "BCD_SCALE_NODES", 10000)
	window := time.Duration(scaleEnv(b, "BCD_SCALE_IDLE_SECONDS", 60)) * time.Second
	connectWait := time.Duration(scaleEnv(b, "BCD_SCALE_CONNECT_MINUTES", 30)) * time.Minute
	c, err := pgtest.StartDurable()
	if errors.Is(err, pgtest.ErrNoPostgres) {
		testenv.Skip(b, "%v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Stop)
	ctx := context.Background()
	run := func(n int) scaleFigures {
		url, err := c.NewDatabase(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l := newLab(b)
		dbFile := filepath.Join(l.root, "database.url")
		if err := os.WriteFile(dbFile, []byte(url+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0", "--database-file", dbFile, "--key-encryption-key", l.kekFile())
		admin := adminapi.NewClient(g.dataDir, "", "")
		tok := l.token(g, "--uses", fmt.Sprint(n))
		cfg := l.simConfig(g, "sim")
		start := time.Now()
		p := l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "1")
		var ids []string
		for end := time.Now().Add(connectWait); time.Now().Before(end); time.Sleep(2 * time.Second) {
			ids = ids[:0]
			for _, x := range l.nodes(g) {
				if x.Connected {
					ids = append(ids, x.ID)
				}
			}
			if len(ids) >= n {
				break
			}
		}
		f := scaleFigures{n: len(ids), connectTook: time.Since(start)}
		if len(ids) < n {
			// Measured with those connected, and said so: the figures
			// are per session held.
			fmt.Printf("scale: only %d of %d agents connected after %s; measuring those\n", len(ids), n, f.connectTook.Round(time.Second))
		}
		if len(ids) == 0 {
			b.Fatalf("no agent connected after %s", f.connectTook.Round(time.Second))
		}
		m := joinedInRe.FindStringSubmatch(p.stdout.String())
		if m == nil {
			b.Fatalf("bcd sim printed %q", p.stdout.String())
		}
		d, _ := time.ParseDuration(m[2])
		joined, _ := strconv.Atoi(m[1])
		f.joinsPerSec = float64(joined) / d.Seconds()
		// The first reports and inventories go out; then the agents idle.
		time.Sleep(20 * time.Second)
		pid := g.cmd.Process.Pid
		rows0, commits0, err := pgWrites(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		cpu0, t0 := procCPU(pid), time.Now()
		time.Sleep(window)
		cpu1, t1 := procCPU(pid), time.Now()
		rows1, commits1, err := pgWrites(ctx, url)
		if err != nil {
			b.Fatal(err)
		}
		secs := t1.Sub(t0).Seconds()
		f.idleCPU = time.Duration(float64(cpu1-cpu0) * float64(time.Minute) / float64(t1.Sub(t0)))
		f.pgWrites, f.pgCommit = (rows1-rows0)/secs, (commits1-commits0)/secs
		f.gwRSS = rssKiB(pid)
		f.simRSS, f.simProcs = treeRSS(p.cmd.Process.Pid)
		f.lat = roundTrips(b, admin, ids, measuredTrips)
		f.p50, f.p99 = f.lat.p50, f.lat.p99
		p.signal(syscall.SIGTERM)
		p.wait(b, 5*time.Minute)
		g.signal(syscall.SIGTERM)
		g.wait(b, time.Minute)
		fmt.Printf("scale: %d agents: %.1f joins/s, all connected in %s, p50 %s p99 %s, bcgw %.0f KiB (%.1f KiB/session), idle CPU %s/min, PostgreSQL %.1f rows/s %.1f commits/s, bcd sim %.0f KiB in %d processes\n",
			f.n, f.joinsPerSec, f.connectTook.Round(time.Second), f.p50, f.p99, f.gwRSS, f.gwRSS/float64(f.n), f.idleCPU.Round(time.Millisecond),
			f.pgWrites, f.pgCommit, f.simRSS, f.simProcs)
		return f
	}
	ref := run(1000)
	big := run(n)
	fmt.Printf("bcd sim at scale: one bcgw on PostgreSQL (durable) on %d cores, %d agents next to 1,000 in the same run:\n", numCPU(), n)
	row := func(name, unit string, v, r float64) {
		fmt.Printf("  %-36s %10.1f %-7s (1,000 agents: %.1f)\n", name, v, unit, r)
	}
	row("joins/s", "", big.joinsPerSec, ref.joinsPerSec)
	row("start to all connected", "s", big.connectTook.Seconds(), ref.connectTook.Seconds())
	row("control round trip p50", "ms", float64(big.p50.Microseconds())/1000, float64(ref.p50.Microseconds())/1000)
	row("control round trip p99", "ms", float64(big.p99.Microseconds())/1000, float64(ref.p99.Microseconds())/1000)
	row("control round trip p99.9", "ms", float64(big.lat.p999.Microseconds())/1000, float64(ref.lat.p999.Microseconds())/1000)
	row("control round trip max", "ms", float64(big.lat.max.Microseconds())/1000, float64(ref.lat.max.Microseconds())/1000)
	row("bcgw RSS per session", "KiB", big.gwRSS/float64(big.n), ref.gwRSS/float64(ref.n))
	row("bcgw RSS", "MiB", big.gwRSS/1024, ref.gwRSS/1024)
	row("bcgw CPU at idle", "ms/min", float64(big.idleCPU.Milliseconds()), float64(ref.idleCPU.Milliseconds()))
	row("PostgreSQL rows written/s at idle", "", big.pgWrites, ref.pgWrites)
	row("PostgreSQL commits/s at idle", "", big.pgCommit, ref.pgCommit)
	row("bcd sim RSS per agent", "KiB", big.simRSS/float64(big.n), ref.simRSS/float64(ref.n))
	fmt.Printf("  bcd sim processes                    %10d         (1,000 agents: %d)\n", big.simProcs, ref.simProcs)
	b.ReportMetric(big.joinsPerSec, "joins/s")
	b.ReportMetric(ref.joinsPerSec, "ref-joins/s")
	b.ReportMetric(float64(big.p50.Microseconds()), "p50-us")
	b.ReportMetric(float64(ref.p50.Microseconds()), "ref-p50-us")
	b.ReportMetric(float64(big.p99.Microseconds()), "p99-us")
	b.ReportMetric(float64(ref.p99.Microseconds()), "ref-p99-us")
	b.ReportMetric(float64(big.lat.p999.Microseconds()), "p99.9-us")
	b.ReportMetric(float64(big.lat.max.Microseconds()), "max-us")
	b.ReportMetric(big.gwRSS/float64(big.n), "gw-KiB/session")
	b.ReportMetric(ref.gwRSS/float64(ref.n), "ref-gw-KiB/session")
	b.ReportMetric(float64(big.idleCPU.Milliseconds()), "gw-idle-cpu-ms/min")
	b.ReportMetric(float64(ref.idleCPU.Milliseconds()), "ref-gw-idle-cpu-ms/min")
	b.ReportMetric(big.pgWrites, "pg-rows/s")
	b.ReportMetric(ref.pgWrites, "ref-pg-rows/s")
	b.ReportMetric(big.pgCommit, "pg-commits/s")
	b.ReportMetric(ref.pgCommit, "ref-pg-commits/s")
	b.ReportMetric(float64(big.n), "agents")
}

// scaleEnv is the positive whole number the scale benchmarks read from
// the environment variable name, def when it is unset.
func scaleEnv(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a whole number above 0", name, v)
	}
	return n
}
