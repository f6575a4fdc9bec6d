package imds

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/netguard"
)

const section = `{"instances":[
 {"id":"vm-a","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]},
 {"id":"vm-b","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0b:00:01","addresses":["10.9.0.6/24"],"policy":"PRIVATE"}]}]}`

const base = "http://10.9.0.1:8080"

// lab is the host namespace (bridge br0, 10.9.0.1/24, the metadata
// service on 10.9.0.1:8080, the policy loaded by a real nft) and two
// guests' namespaces, vm-a (10.9.0.5) and vm-b (10.9.0.6).
type lab struct {
	host, a, b *netpolicytest.NS
	guard      *netguard.Guard
	helper     *netpolicytest.Helper
}

func newLab(t *testing.T) *lab {
	testenv.NeedTool(t, "curl", "curl")
	host := netpolicytest.New(t)
	host.Bridge("br0", "10.9.0.1/24")
	l := &lab{host: host}
	l.a = host.Guest("br0", netpolicy.TapName("vm-a", 0), "52:54:00:0a:00:01", "10.9.0.5/24")
	l.b = host.Guest("br0", netpolicy.TapName("vm-b", 0), "52:54:00:0b:00:01", "10.9.0.6/24")
	l.guard, l.helper = serve(t, host, section)
	return l
}

// serve loads the policy of section in host by a real nft and serves the
// metadata service on 10.9.0.1:8080 there, its identity tokens stand-ins
// naming the instance and the audience.
func serve(t *testing.T, host *netpolicytest.NS, section string) (*netguard.Guard, *netpolicytest.Helper) {
	helper := &netpolicytest.Helper{NS: host}
	guard := netguard.New(helper, nil)
	if _, err := guard.Apply(context.Background(), []byte(section), rootsig.Proof{}); err != nil {
		t.Fatal(err)
	}
	tokens := func(_ context.Context, instance, audience string) (string, error) {
		return "jwt-for:" + instance + ":" + audience, nil
	}
	srv := New(guard, tokens, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var ln interface{ Close() error }
	err := host.Do(func() error {
		lis, err := Listen(ctx, "10.9.0.1:8080", false)
		if err == nil {
			ln = lis
			go srv.Serve(ctx, lis)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return guard, helper
}

// curl runs curl in ns and returns the body and HTTP status.
func curl(ns *netpolicytest.NS, args ...string) (string, int, error) {
	out, err := ns.Try(nil, append([]string{"curl", "-sS", "--max-time", "3", "-w", "\n%{http_code}"}, args...)...)
	i := strings.LastIndexByte(out, '\n')
	if i < 0 {
		return out, 0, err
	}
	var code int
	fmt.Sscan(out[i+1:], &code)
	return out[:i], code, err
}

func token(t *testing.T, ns *netpolicytest.NS) string {
	t.Helper()
	body, code, err := curl(ns, "-X", "PUT", "-H", TokenTTLHeader+": 60", base+"/latest/api/token")
	if err != nil || code != 200 || len(body) < 40 {
		t.Fatalf("PUT token: %d %q %v", code, body, err)
	}
	return body
}

// TestFromGuest: a guest gets a session token, then an identity token for
// its audience naming itself; another guest cannot use its session token,
// nor can a request that says it was forwarded.
func TestFromGuest(t *testing.T) {
	l := newLab(t)
	tok := token(t, l.a)
	body, code, err := curl(l.a, "-H", TokenHeader+": "+tok, base+"/latest/identity-token?audience=sts.example.com")
	if err != nil || code != 200 || body != "jwt-for:vm-a:sts.example.com" {
		t.Fatalf("identity token: %d %q %v", code, body, err)
	}
	for _, c := range []struct {
		name string
		ns   *netpolicytest.NS
		args []string
		code int
		want string
	}{
		{"another instance's session token", l.b, []string{"-H", TokenHeader + ": " + tok}, 403, "another instance"},
		{"no session token", l.a, nil, 401, "session token"},
		{"a made-up session token", l.a, []string{"-H", TokenHeader + ": x" + tok[1:]}, 401, "session token"},
		{"X-Forwarded-For", l.a, []string{"-H", TokenHeader + ": " + tok, "-H", "X-Forwarded-For: 10.9.0.6"}, 403, "forwarded"},
		{"Forwarded", l.a, []string{"-H", TokenHeader + ": " + tok, "-H", "Forwarded: for=10.9.0.6"}, 403, "forwarded"},
		{"Via", l.a, []string{"-H", TokenHeader + ": " + tok, "-H", "Via: 1.1 proxy"}, 403, "forwarded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, code, _ := curl(c.ns, append(c.args, base+"/latest/identity-token?audience=sts.example.com")...)
			if code != c.code || !strings.Contains(body, c.want) {
				t.Fatalf("%d %q, want %d %q", code, body, c.code, c.want)
			}
		})
	}
	if body, code, _ := curl(l.a, "-H", TokenHeader+": "+tok, base+"/latest/identity-token?audience=a%20b"); code != 400 {
		t.Fatalf("an audience with a space: %d %q", code, body)
	}
	if body, code, _ := curl(l.a, "-X", "PUT", "-H", TokenTTLHeader+": 99999", base+"/latest/api/token"); code != 400 {
		t.Fatalf("a TTL over 6 h: %d %q", code, body)
	}
}

// TestForwardedThroughGuest: a machine behind vm-a, NATed by it, reaches
// the service with vm-a's address, but no answer gets past vm-a (hop
// limit 1); vm-a itself is answered.
func TestForwardedThroughGuest(t *testing.T) {
	l := newLab(t)
	behind := netpolicytest.New(t)
	l.a.Run("ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", behind.Name)
	l.a.Run("ip", "addr", "add", "10.50.0.1/24", "dev", "lan0")
	l.a.Run("ip", "link", "set", "lan0", "up")
	behind.Run("ip", "addr", "add", "10.50.0.2/24", "dev", "eth0")
	behind.Run("ip", "link", "set", "eth0", "up")
	behind.Run("ip", "route", "add", "default", "via", "10.50.0.1")
	l.a.Run("sysctl", "-qw", "net.ipv4.ip_forward=1")
	if _, err := l.a.Try([]byte("table ip nat {\n chain post {\n type nat hook postrouting priority 100;\n oifname \"eth0\" masquerade\n }\n}\n"), "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if body, code, err := curl(behind, "-X", "PUT", "-H", TokenTTLHeader+": 60", base+"/latest/api/token"); err == nil || code == 200 {
		t.Fatalf("a machine behind the guest got an answer: %d %q", code, body)
	}
	token(t, l.a)
}

// TestRefusedWhileReloading: `nft flush table bridge bcd_instances` by
// hand; until the check has loaded the tables again the service answers
// no one, then it answers again.
func TestRefusedWhileReloading(t *testing.T) {
	l := newLab(t)
	tok := token(t, l.a)
	during := make(chan int, 4)
	l.helper.OnLoad(func() {
		_, code, _ := curl(l.a, "-H", TokenHeader+": "+tok, base+"/latest/identity-token?audience=x")
		during <- code
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.guard.Run(ctx, netguard.Interval)
	l.host.Run("nft", "flush", "table", "bridge", "bcd_instances")
	select {
	case code := <-during:
		if code != 403 {
			t.Fatalf("while the tables loaded again the service answered %d", code)
		}
	case <-time.After(7 * time.Second):
		t.Fatal("the flushed tables were not loaded again within 7 s")
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, code, _ := curl(l.a, "-H", TokenHeader+": "+tok, base+"/latest/identity-token?audience=x"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the service does not answer after the reload")
		}
	}
}

// TestEC2Listen: on an EC2 host the service refuses AWS's metadata
// addresses; elsewhere, and other addresses, it takes.
func TestEC2Listen(t *testing.T) {
	for _, c := range []struct {
		addr string
		ec2  bool
		ok   bool
	}{
		{"169.254.169.254:80", true, false},
		{"[fd00:ec2::254]:80", true, false},
		{"169.254.169.254:80", false, true},
		{"10.9.0.1:80", true, true},
		{"imds.example:80", false, false},
	} {
		if err := CheckListen(c.addr, c.ec2); (err == nil) != c.ok {
			t.Errorf("CheckListen(%s, ec2 %v) = %v", c.addr, c.ec2, err)
		}
	}
	if err := CheckListen("169.254.169.254:80", true); !strings.Contains(err.Error(), "EC2's own instance metadata service") {
		t.Errorf("error %v", err)
	}
	_ = netip.Addr{}
}
