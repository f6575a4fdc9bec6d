package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tcpLab is bcgw and one fakehw node whose access section holds only the
// exec-ticket JWKS (no sshd needed: TCP tunnels only).
type tcpLab struct {
	*lab
	g       *gw
	cfg, id string
	node    *proc
}

func newTCPLab(t testing.TB) *tcpLab {
	l := newLab(t)
	s := &tcpLab{lab: l}
	s.g = l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	s.cfg, s.id = l.joinNode(s.g, "n", l.token(s.g, "--uses", "1"), "node")
	s.node = l.start("bcd-node", "node", "--config", s.cfg)
	l.waitNode(s.g, s.id, "connected", func(n nodeView) bool { return n.Connected })
	s.bcgw(s.g, "ssh-ca", s.id, "--jwks-only")
	return s
}

// tunnel starts bcgw tunnel NODE --tcp PORT with its stdin and stdout as
// pipes the caller drives.
func (s *tcpLab) tunnel(port int) (*exec.Cmd, io.WriteCloser, io.ReadCloser, *syncBuf) {
	s.t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "bcgw"), "tunnel", s.id, "--tcp", strconv.Itoa(port), "--data-dir", s.g.dataDir)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	se := &syncBuf{name: "bcgw tunnel (stderr)"}
	s.out.add(se)
	cmd.Stderr = se
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, in, out, se
}

// serve listens on loopback and runs handle for each connection.
func serve(t testing.TB, handle func(net.Conn)) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// echo answers what it reads and closes at EOF.
func echo(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
}

// tunnels is bcd status's tunnel count.
func (s *tcpLab) tunnels() int {
	_, out, _ := s.run("", nil, "bcd-node", "status", "--config", s.cfg, "--json")
	var st struct {
		Tunnels []json.RawMessage `json:"tunnels"`
	}
	if json.Unmarshal([]byte(out), &st) != nil {
		return -1
	}
	return len(st.Tunnels)
}

// rss is a process's resident memory in KiB.
func rss(t *testing.T, pid int) int64 {
	v := rssKiB(pid)
	if v == 0 {
		t.Fatalf("no VmRSS for pid %d", pid)
	}
	return int64(v)
}

// TestTCPTunnel: bytes go both ways through bcgw tunnel --tcp, and the end
// of standard input reaches the target as EOF.
func TestTCPTunnel(t *testing.T) {
	s := newTCPLab(t)
	port := serve(t, echo)
	var out []byte
	eventually(t, "an echo through bcgw tunnel --tcp", func() error {
		cmd, in, stdout, se := s.tunnel(port)
		msg := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB, several frames
		go func() { io.WriteString(in, msg); in.Close() }()
		out, _ = io.ReadAll(stdout)
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("%v: %s", err, se.String())
		}
		if string(out) != msg {
			return fmt.Errorf("echoed %d bytes, want %d", len(out), len(msg))
		}
		return nil
	})
	// The exec ticket (an ES256 JWS: base64url of {"alg":"ES256",...) is a
	// bearer credential: no process prints it.
	s.out.assertAbsent(t, "an exec ticket", ticketPrefix)
}

// ticketPrefix starts every exec ticket bcgw signs.
const ticketPrefix = "eyJhbGciOiJFUzI1NiIs"

// TestTunnelLimitAndFlowControl: 16 tunnels open at once and the 17th is
// refused; a target that stops reading and a client that stops reading
// each stop the sender, and neither the node's nor bcgw's memory grows
// past a bound while they do.
func TestTunnelLimitAndFlowControl(t *testing.T) {
	s := newTCPLab(t)
	// Holds every connection open, reading nothing.
	var held sync.WaitGroup
	stopHold := make(chan struct{})
	t.Cleanup(func() { close(stopHold) })
	hold := serve(t, func(c net.Conn) {
		held.Add(1)
		defer held.Done()
		<-stopHold
		c.Close()
	})
	eventually(t, "the node holds the JWKS", func() error {
		cmd, in, stdout, se := s.tunnel(serve(t, echo))
		io.WriteString(in, "x")
		in.Close()
		io.ReadAll(stdout)
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("%v: %s", err, se.String())
		}
		return nil
	})
	gwBase, nodeBase := rss(t, s.g.cmd.Process.Pid), rss(t, s.node.cmd.Process.Pid)

	// A target that stops reading: the writer into bcgw tunnel stops.
	_, in, _, _ := s.tunnel(hold)
	var written atomic.Int64
	go func() {
		chunk := make([]byte, 32<<10)
		for written.Load() < 1<<30 {
			if _, err := in.Write(chunk); err != nil {
				return
			}
			written.Add(int64(len(chunk)))
		}
	}()
	// A client that stops reading: the source on the node stops.
	var sourced atomic.Int64
	source := serve(t, func(c net.Conn) {
		defer c.Close()
		chunk := make([]byte, 32<<10)
		for sourced.Load() < 1<<30 {
			if _, err := c.Write(chunk); err != nil {
				return
			}
			sourced.Add(int64(len(chunk)))
		}
	})
	s.tunnel(source) // its stdout is never read
	plateau := func(what string, n *atomic.Int64) int64 {
		last := int64(-1)
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Second) {
			cur := n.Load()
			if cur == last && cur > 0 {
				return cur
			}
			last = cur
		}
		t.Fatalf("%s never stopped: %d bytes", what, n.Load())
		return 0
	}
	w, src := plateau("the writer into a target that does not read", &written), plateau("the source to a client that does not read", &sourced)
	gwRSS, nodeRSS := rss(t, s.g.cmd.Process.Pid), rss(t, s.node.cmd.Process.Pid)
	t.Logf("stopped after %d MiB in and %d MiB out; RSS bcgw %d -> %d KiB, node %d -> %d KiB",
		w>>20, src>>20, gwBase, gwRSS, nodeBase, nodeRSS)
	const bound = 64 << 20
	if w > bound || src > bound {
		t.Errorf("buffered %d and %d bytes before the senders stopped; the bound is %d", w, src, bound)
	}
	if (gwRSS-gwBase)<<10 > bound || (nodeRSS-nodeBase)<<10 > bound {
		t.Errorf("RSS grew by %d KiB (bcgw) and %d KiB (node); the bound is %d KiB", gwRSS-gwBase, nodeRSS-nodeBase, bound>>10)
	}

	// 14 more tunnels make 16; the 17th is refused.
	for i := 0; i < 14; i++ {
		s.tunnel(hold)
	}
	eventually(t, "16 tunnels open", func() error {
		if n := s.tunnels(); n != 16 {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
	code, _, errOut := s.run("", nil, "bcgw", "tunnel", s.id, "--tcp", strconv.Itoa(hold), "--data-dir", s.g.dataDir)
	if code != 1 || !strings.Contains(errOut, "16 tunnels are open on this node") {
		t.Fatalf("the 17th tunnel: exit %d: %s", code, errOut)
	}
}
