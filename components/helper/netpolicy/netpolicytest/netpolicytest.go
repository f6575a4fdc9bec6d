//go:build linux

// Package netpolicytest is a network namespace the instances' network
// tests make for themselves: a bridge with the host's addresses, veth
// pairs standing in for taps (the bridge end named as bcd names a tap,
// the other end the guest's), nft run inside it, and raw packet sockets
// on any of its interfaces to write crafted frames and count those that
// arrive. Nothing of it touches the machine's own network. It needs root,
// ip (iproute2) and nft (nftables).
package netpolicytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// NS is a network namespace of the test.
type NS struct {
	Name string
	t    testing.TB
}

// New makes a network namespace named after the test, removed at its end,
// with loopback up. It skips the test (fails it under CI) without root,
// ip or nft.
func New(t testing.TB) *NS {
	t.Helper()
	testenv.NeedRoot(t, "network namespaces, bridges and nftables")
	testenv.NeedTool(t, "ip", "iproute2")
	testenv.NeedTool(t, "nft", "nftables")
	name := fmt.Sprintf("bcdnp%d%d", os.Getpid(), time.Now().UnixNano()%100000)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ns := &NS{Name: name, t: t}
	ns.Run("ip", "link", "set", "lo", "up")
	return ns
}

// Run runs a command inside the namespace and fails the test if it fails.
func (ns *NS) Run(args ...string) string {
	ns.t.Helper()
	out, err := ns.Try(nil, args...)
	if err != nil {
		ns.t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return out
}

// Try runs a command inside the namespace with stdin.
func (ns *NS) Try(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Nft runs nft in the namespace with stdin, for a test's own loader.
func (ns *NS) Nft(ctx context.Context, stdin []byte, args ...string) ([]byte, error) {
	out, err := ns.Try(stdin, append([]string{"nft"}, args...)...)
	return []byte(out), err
}

// Bridge makes bridge name with addrs (CIDR, IPv6 without DAD), up.
func (ns *NS) Bridge(name string, addrs ...string) {
	ns.t.Helper()
	ns.Run("ip", "link", "add", name, "type", "bridge")
	ns.Run("sysctl", "-qw", "net.ipv6.conf."+name+".accept_ra=0")
	for _, a := range addrs {
		if strings.Contains(a, ":") {
			ns.Run("ip", "-6", "addr", "add", a, "dev", name, "nodad")
		} else {
			ns.Run("ip", "addr", "add", a, "dev", name)
		}
	}
	ns.Run("ip", "link", "set", name, "up")
}

// Port makes a veth pair: port on bridge (none: not bridged), peer
// outside it with IPv6 off (it sends nothing of its own) and mac, if
// given.
func (ns *NS) Port(bridge, port, peer, mac string) {
	ns.t.Helper()
	ns.Run("ip", "link", "add", port, "type", "veth", "peer", "name", peer)
	ns.Run("sysctl", "-qw", "net.ipv6.conf."+peer+".disable_ipv6=1")
	ns.Run("sysctl", "-qw", "net.ipv6.conf."+port+".disable_ipv6=1")
	if mac != "" {
		ns.Run("ip", "link", "set", peer, "address", mac)
	}
	if bridge != "" {
		ns.Run("ip", "link", "set", port, "master", bridge)
	}
	ns.Run("ip", "link", "set", port, "up")
	ns.Run("ip", "link", "set", peer, "up")
}

// Do runs f on a thread inside the namespace: sockets f opens belong to
// it and may be used from anywhere after.
func (ns *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and dies with this goroutine.
			errc <- fmt.Errorf("setns back: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Port is a raw packet socket on an interface of the namespace: it writes
// frames and records those that arrive.
type Socket struct {
	Name string
	HW   net.HardwareAddr
	conn *packet.Conn
	mu   sync.Mutex
	seen [][]byte
}

// Open opens a raw socket on interface name, closed at the test's end.
func (ns *NS) Open(name string) *Socket {
	ns.t.Helper()
	s := &Socket{Name: name}
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		s.HW = ifi.HardwareAddr
		s.conn, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
		return err
	})
	if err != nil {
		ns.t.Fatalf("packet socket on %s: %v", name, err)
	}
	ns.t.Cleanup(func() { s.conn.Close() })
	go func() {
		buf := make([]byte, 9000)
		for {
			n, _, err := s.conn.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.seen = append(s.seen, bytes.Clone(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s
}

// Send writes one whole Ethernet frame.
func (s *Socket) Send(frame []byte) error {
	_, err := s.conn.WriteTo(frame, &packet.Addr{HardwareAddr: net.HardwareAddr(frame[:6])})
	return err
}

// Saw reports whether a frame holding marker arrived.
func (s *Socket) Saw(marker []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.seen {
		if bytes.Contains(f, marker) {
			return true
		}
	}
	return false
}

// SawFunc reports whether an arrived frame satisfies f.
func (s *Socket) SawFunc(f func([]byte) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, fr := range s.seen {
		if f(fr) {
			return true
		}
	}
	return false
}

// Helper does in the namespace what bcd helper does for netpolicy.apply
// and firewall.check (components/helper tests the helper itself): the
// policy rendered by netpolicy, loaded and counted by a real nft. It
// implements the node's netguard.Helper. Loading, when set, is called
// before each load.
type Helper struct {
	NS      *NS
	mu      sync.Mutex
	loading func()
}

// OnLoad sets the function called before each load.
func (h *Helper) OnLoad(f func()) {
	h.mu.Lock()
	h.loading = f
	h.mu.Unlock()
}

// ApplyNetPolicy plans, renders and loads section's policy.
func (h *Helper) ApplyNetPolicy(ctx context.Context, section []byte, _ rootsig.Proof) (int64, map[string]string, error) {
	h.mu.Lock()
	hook := h.loading
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	in, err := netpolicy.Decode(section)
	if err != nil {
		return 0, nil, err
	}
	var host netpolicy.Host
	if err := h.NS.Do(func() (err error) { host, err = netpolicy.ReadHost("/sys", netpolicy.BridgeNames(in)); return err }); err != nil {
		return 0, nil, err
	}
	taps, _, failed := netpolicy.Plan(in, host)
	rules, err := netpolicy.Render(taps, host)
	if err != nil {
		return 0, nil, err
	}
	if _, err := h.NS.Nft(ctx, rules, "-f", "-"); err != nil {
		return 0, nil, err
	}
	n, err := h.Count(ctx)
	return n, failed, err
}

// Count counts the rules of bcd's tables; -1 when bridge bcd_instances
// is not loaded.
func (h *Helper) Count(ctx context.Context) (int64, error) {
	var n int64
	for _, t := range netpolicy.Tables {
		fam, name, _ := strings.Cut(t, " ")
		out, err := h.NS.Nft(ctx, nil, "-j", "list", "table", fam, name)
		if err != nil {
			if t == netpolicy.Tables[0] {
				return -1, nil
			}
			continue
		}
		var doc struct {
			Nftables []map[string]json.RawMessage `json:"nftables"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			return 0, err
		}
		for _, o := range doc.Nftables {
			if _, ok := o["rule"]; ok {
				n++
			}
		}
	}
	return n, nil
}

// CheckFirewall reports whether the tables hold rules rules.
func (h *Helper) CheckFirewall(ctx context.Context, rules int64) (bool, error) {
	n, err := h.Count(ctx)
	return err == nil && n == rules, err
}

// Guest makes a second namespace standing in for an instance: a veth
// pair whose end tap is on bridge in ns, the other end eth0 in the guest
// with mac and addr (CIDR), up, IPv6 off.
func (ns *NS) Guest(bridge, tap, mac, addr string) *NS {
	ns.t.Helper()
	g := New(ns.t)
	ns.Run("ip", "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", g.Name)
	ns.Run("sysctl", "-qw", "net.ipv6.conf."+tap+".disable_ipv6=1")
	ns.Run("ip", "link", "set", tap, "master", bridge)
	ns.Run("ip", "link", "set", tap, "up")
	g.Run("sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1")
	g.Run("ip", "link", "set", "eth0", "address", mac)
	g.Run("ip", "addr", "add", addr, "dev", "eth0")
	g.Run("ip", "link", "set", "eth0", "up")
	return g
}
