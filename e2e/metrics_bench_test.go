package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkGatewayMetrics prints bcgw's CPU per minute while bcd sim's
// agents (200; BCD_SIM_NODES overrides) heartbeat every 3 s, with its
// metrics scraped every second, next to the same gateway unscraped in
// the window before; and one scrape's size and time.
func BenchmarkGatewayMetrics(b *testing.B) {
	n := 200
	if v := os.Getenv("BCD_SIM_NODES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	const window = 30 * time.Second
	l := newLab(b)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0", "--heartbeat", "3s", "--metrics", "0", "--name", "gw-bench")
	addr, _ := g.waitLog(b, "bcgw serving", 5*time.Second)["metrics_addr"].(string)
	pid := g.cmd.Process.Pid
	tok := l.token(g, "--uses", fmt.Sprint(n))
	cfg := l.simConfig(g, "sim")
	p := l.startStdin(tok+"\n", nil, "bcd-node", "sim", "--config", cfg, "--nodes", fmt.Sprint(n), "--seed", "1")
	for end := time.Now().Add(5 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		c := 0
		for _, x := range l.nodes(g) {
			if x.Connected {
				c++
			}
		}
		if c >= n {
			break
		}
		if time.Now().After(end) {
			b.Fatalf("%d of %d agents connected", c, n)
		}
	}
	time.Sleep(5 * time.Second) // first reports and the inventory
	cpu0 := procCPU(pid)
	time.Sleep(window)
	cpu1 := procCPU(pid)
	var size int
	var took time.Duration
	scrapes := 0
	for end := time.Now().Add(window); time.Now().Before(end); time.Sleep(time.Second) {
		start := time.Now()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took += time.Since(start)
		size = len(body)
		scrapes++
	}
	cpu2 := procCPU(pid)
	p.signal(syscall.SIGTERM)
	p.wait(b, 2*time.Minute)
	scale := float64(time.Minute) / float64(window)
	plain := time.Duration(float64(cpu1-cpu0) * scale)
	scraped := time.Duration(float64(cpu2-cpu1) * scale)
	per := took / time.Duration(scrapes)
	fmt.Printf("bcgw metrics with %d bcd sim agents (heartbeat 3 s) on %d cores:\n", n, numCPU())
	fmt.Printf("  bcgw CPU per minute, scraped every second  %8s   (not scraped: %s)\n", scraped.Round(time.Millisecond), plain.Round(time.Millisecond))
	fmt.Printf("  one scrape: %d bytes in %s\n", size, per.Round(time.Microsecond))
	b.ReportMetric(float64(scraped.Milliseconds()), "scraped-cpu-ms/min")
	b.ReportMetric(float64(plain.Milliseconds()), "cpu-ms/min")
	b.ReportMetric(float64(size), "scrape-B")
	b.ReportMetric(float64(per.Microseconds()), "scrape-us")
}
