package e2e

import (
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// BenchmarkTunnel is make bench's tunnel figure: MB/s through bcgw tunnel
// --tcp (bcgw tunnel -> bcgw admin socket -> mTLS Tunnel stream -> the
// node -> a loopback sink) next to a direct loopback copy of the same
// bytes to the same kind of sink, in the same run.
func BenchmarkTunnel(b *testing.B) {
	const size = 256 << 20
	s := newTCPLab(b)
	got := make(chan int64, 4)
	sink := serve(b, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		got <- n
	})
	// The node holds the JWKS once a tunnel opens.
	eventually(b, "a first tunnel", func() error {
		cmd := exec.Command(filepath.Join(s.bin, "bcgw"), "tunnel", s.id, "--tcp", strconv.Itoa(sink), "--data-dir", s.g.dataDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		<-got
		return nil
	})
	zeros := make([]byte, 1<<20)
	direct := func() time.Duration {
		start := time.Now()
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(sink))
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < size/len(zeros); i++ {
			if _, err := c.Write(zeros); err != nil {
				b.Fatal(err)
			}
		}
		c.(*net.TCPConn).CloseWrite()
		if n := <-got; n != size {
			b.Fatalf("the sink got %d bytes", n)
		}
		c.Close()
		return time.Since(start)
	}
	tunnel := func() time.Duration {
		start := time.Now()
		cmd := exec.Command(filepath.Join(s.bin, "bcgw"), "tunnel", s.id, "--tcp", strconv.Itoa(sink), "--data-dir", s.g.dataDir)
		in, _ := cmd.StdinPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < size/len(zeros); i++ {
			if _, err := in.Write(zeros); err != nil {
				b.Fatal(err)
			}
		}
		in.Close()
		if n := <-got; n != size {
			b.Fatalf("the sink got %d bytes through the tunnel", n)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatalf("bcgw tunnel: %v", err)
		}
		return time.Since(start)
	}
	mbps := func(d time.Duration) float64 { return float64(size) / 1e6 / d.Seconds() }
	var dt, tt time.Duration
	for i := 0; i < b.N; i++ {
		dt += direct()
		tt += tunnel()
	}
	n := float64(b.N)
	fmt.Printf("tunnel throughput, %d MiB to a loopback sink on %d cores:\n", size>>20, numCPU())
	fmt.Printf("  through bcgw tunnel --tcp   %8.1f MB/s   (direct loopback copy: %.1f MB/s)\n", mbps(tt/time.Duration(n)), mbps(dt/time.Duration(n)))
	b.ReportMetric(mbps(tt/time.Duration(n)), "MB/s")
	b.ReportMetric(mbps(dt/time.Duration(n)), "ref-MB/s")
}
