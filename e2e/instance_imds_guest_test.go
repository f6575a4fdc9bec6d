package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/guestimage"
	"github.com/better-compute/bcd/components/vm/libvirttest"
)

// inGuestNetNS runs test (the calling test's name) again inside a network
// namespace it makes, with a bridge br0 holding the host's 10.9.0.1/24,
// and answers true when the caller is that run (its body goes on).
// setup may add to the namespace and answers environment the inner run
// gets. The guest image is built (or found) out here: a build fetches
// from the Debian mirror, which the namespace cannot reach.
func inGuestNetNS(t *testing.T, test string, setup func(ns *netpolicytest.NS) []string) bool {
	t.Helper()
	if os.Getenv(netnsEnv) != "" {
		return true
	}
	guestimage.Cached(t)
	ns := netpolicytest.New(t)
	ns.Bridge("br0", "10.9.0.1/24")
	env := []string{netnsEnv + "=" + ns.Name}
	if setup != nil {
		env = append(env, setup(ns)...)
	}
	cmd := exec.Command("ip", "netns", "exec", ns.Name, os.Args[0], "-test.run", "^"+test+"$", "-test.v", "-test.timeout", "25m")
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("inside %s:\n%s", ns.Name, out.String())
	if err != nil {
		t.Fatalf("the test inside the network namespace: %v", err)
	}
	return false
}

// otherEnv names the namespace of the machine on the bridge that is no
// instance (TestIdentityTokenFromRealGuest).
const otherEnv = "BCD_E2E_OTHER_NETNS"

// imdsAudience is the audience the guest asks its identity token for.
const imdsAudience = "sts.bcd-e2e.example"

// imdsUserData is vm-i's cloud-init user data: it takes the NIC's
// address from the seed's network-config (which the node rendered from
// the NIC's addresses; the guest image has cloud-init configure no
// network, so cloud-init's own net-convert renders it for
// systemd-networkd here), asks the node's metadata service for a session
// token and an identity token, asks again saying it forwards for another
// address, then takes a second address and asks from it; each answer
// goes to the serial console.
const imdsUserData = `#cloud-config
runcmd:
  - |
    mount -o ro /dev/disk/by-label/cidata /mnt
    cloud-init devel net-convert -p /mnt/network-config -k yaml -d / -D debian -O networkd
    umount /mnt
    systemctl start systemd-networkd
    for i in $(seq 30); do ip -4 -o addr show eth0 | grep -q 10.9.0.5 && break; sleep 1; done
    echo "bcd-imds-address $(ip -4 -o addr show eth0 | awk '{print $4}') bcd-imds-end" > /dev/ttyS0
    url=http://10.9.0.1:8080/latest
    for i in $(seq 60); do T=$(curl -sSf --max-time 10 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 600" $url/api/token) && break; sleep 2; done
    echo "bcd-imds-session $T bcd-imds-end" > /dev/ttyS0
    for i in $(seq 30); do J=$(curl -sSf --max-time 30 -H "X-aws-ec2-metadata-token: $T" "$url/identity-token?audience=` + imdsAudience + `") && break; sleep 2; done
    echo "bcd-imds-identity $J bcd-imds-end" > /dev/ttyS0
    echo "bcd-imds-forwarded $(curl -s -o /dev/null -w '%{http_code}' -H "X-aws-ec2-metadata-token: $T" -H "X-Forwarded-For: 10.9.0.6" "$url/identity-token?audience=` + imdsAudience + `")" > /dev/ttyS0
    ip addr add 10.9.0.6/24 dev eth0
    echo "bcd-imds-spoofed $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 --interface 10.9.0.6 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" $url/api/token)" > /dev/ttyS0
`

// TestIdentityTokenFromRealGuest: the metadata chain from a real guest,
// end to end. An unprivileged host-build bcd node with [imds] listen on
// the bridge's address, beside a real bcd helper and a real libvirtd, all
// in a network namespace the test makes, runs vm-i from a signed spec: the
// helper loads its PRIVATE NIC's policy with a real nft and starts the
// real Debian guest (guestimage). Its NIC takes its address from the
// seed's network-config, and its cloud-init (user data) curls the
// node's metadata service: a session token, then an identity token for
// imdsAudience, which the node gets from bcgw through the session's
// WorkloadTokenRequest. The token verifies under bcgw's workload signing
// key (its kid that key's pin), names bcgw, the node and vm-i and the
// audience. The guest's request saying it forwards for another address
// gets 403, and one from an address the NIC does not own gets nothing
// (the tap's guard drops it). A machine on the bridge that is no
// instance (10.9.0.9) is refused a session token and an identity token
// with the guest's own session token, as is the host's own address.
func TestIdentityTokenFromRealGuest(t *testing.T) {
	testenv.NeedRoot(t, "it makes network namespaces, creates a user, runs bcd helper and libvirtd as root")
	if !inGuestNetNS(t, "TestIdentityTokenFromRealGuest", func(ns *netpolicytest.NS) []string {
		other := ns.Guest("br0", "othr0", "52:54:00:0a:00:09", "10.9.0.9/24")
		return []string{otherEnv + "=" + other.Name}
	}) {
		return
	}
	curlBin := testenv.NeedTool(t, "curl", "curl")
	img := guestimage.Cached(t)
	d := libvirttest.StartWith(t, libvirttest.Options{ReadOnlyForAll: true})
	l := newLab(t)
	digest, imageURL, pin := fileServer(t, img.Path, img.SHA256)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	extra := fmt.Sprintf("\n[instances]\naccel = %q\nlibvirt_socket = %q\n\n[imds]\nlisten = \"10.9.0.1:8080\"\n", libvirttest.Accel(), d.Socket())
	hn := newHelperNode(t, l, g, sshdtest.Root(t), "bcd-node-host", "", extra)
	helper := hn.root.start("bcd-helper", "helper", "--config", hn.cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	node := hn.asUser.start("bcd-node", "node", "--config", hn.cfg)
	l.waitNode(g, hn.id, "connected", func(n nodeView) bool { return n.Connected })
	node.waitLog(t, "imds: serving the instances' metadata service", 30*time.Second)

	// The host's own address is no instance's.
	curl := func(netns string, args ...string) string {
		t.Helper()
		cmd := exec.Command(curlBin, append([]string{"-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"}, args...)...)
		if netns != "" {
			cmd = exec.Command("ip", append([]string{"netns", "exec", netns, curlBin, "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"}, args...)...)
		}
		out, _ := cmd.Output()
		return string(out)
	}
	const url = "http://10.9.0.1:8080/latest"
	putToken := []string{"-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60", url + "/api/token"}
	if code := curl("", putToken...); code != "403" {
		t.Errorf("a session token for the host's own address: HTTP %s, want 403", code)
	}

	ud := filepath.Join(l.root, "user-data")
	if err := os.WriteFile(ud, []byte(imdsUserData), 0o600); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "secret", "set", "instance-user-data/alloc_i", "--node", hn.id, "--value-file", ud)
	console := d.ReadConsole(t, "vm-i")
	l.bcgw(g, "spec", "patch", hn.id, "--file", l.specFile("vm-i.json", fmt.Sprintf(`{"instances":{
 "images":[{"sha256":%q,"url":%q,"format":"qcow2","spki_pin":%q}],
 "instances":[{"id":"vm-i","allocation":"alloc_i","state":"RUNNING","vcpus":1,"memory_mib":512,"image":%q,"user_data":true,
  "nics":[{"bridge":"br0","mac":"52:54:00:0a:00:05","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]}]}}`, digest, imageURL, pin, digest)))
	l.waitStatus(g, hn.id, "vm-i running", func(s adminapi.StatusView) bool {
		return section(s, "instances").State == "CONVERGED" && s.ObservedGeneration == s.SpecGeneration
	})

	answer := func(what string, limit time.Duration) string {
		t.Helper()
		re := regexp.MustCompile(what + ` (\S*)`)
		if !console.Wait(what+" ", limit) {
			t.Fatalf("no %q on vm-i's console within %s; the console:\n%s", what, limit, console.String())
		}
		// The rest of the line may still be on its way.
		var m []string
		for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			s := console.String()
			if m = re.FindStringSubmatch(s[strings.Index(s, what):]); m != nil && strings.ContainsAny(s[strings.Index(s, what)+len(m[0]):], "\r\n") {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("%q's line on vm-i's console did not end; the console:\n%s", what, s)
			}
		}
		return m[1]
	}
	if got := answer("bcd-imds-address", 12*time.Minute); got != "10.9.0.5/24" {
		t.Errorf("vm-i's eth0 took %q from its seed's network-config, want 10.9.0.5/24", got)
	}
	session := answer("bcd-imds-session", 3*time.Minute)
	t.Logf("vm-i got its session token (%d characters) %s after its console opened", len(session), time.Since(console.Opened()).Round(time.Second))
	if len(session) != 43 { // 32 random bytes, base64 without padding
		t.Errorf("vm-i's session token is %q, want 43 characters", session)
	}
	token := answer("bcd-imds-identity", 3*time.Minute)
	if got := answer("bcd-imds-forwarded", time.Minute); got != "403" {
		t.Errorf("vm-i's request saying it forwards for 10.9.0.6: HTTP %s, want 403", got)
	}
	if got := answer("bcd-imds-spoofed", time.Minute); got != "000" {
		t.Errorf("vm-i's request from 10.9.0.6, an address its NIC does not own: HTTP %s, want none (000: dropped by the tap's guard)", got)
	}

	// The token is bcgw's: ES256 under its workload signing key (the key
	// file in its data directory), for the audience, naming the node and
	// the instance.
	kb, err := os.ReadFile(filepath.Join(g.dataDir, "workload-signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.ParsePrivateKeyPEM(kb)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := pki.Pin(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	jws, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatalf("vm-i's identity token %q: %v", token, err)
	}
	if got := jws.Headers[0].KeyID; got != kid {
		t.Errorf("the token's kid is %q, want %q, the pin of bcgw's workload key", got, kid)
	}
	var claims struct {
		jwt.Claims
		Instance string `json:"instance"`
	}
	if err := jws.Claims(key.Public(), &claims); err != nil {
		t.Fatalf("vm-i's identity token does not verify under bcgw's workload key: %v", err)
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: "bcgw", Subject: hn.id, AnyAudience: jwt.Audience{imdsAudience}, Time: time.Now()}, time.Minute); err != nil {
		t.Errorf("vm-i's identity token's claims %+v: %v", claims.Claims, err)
	}
	t.Logf("vm-i's identity token: kid %s, iss %s, sub %s, aud %v, instance %s, valid %s", jws.Headers[0].KeyID, claims.Issuer, claims.Subject, claims.Audience, claims.Instance, claims.Expiry.Time().Sub(claims.IssuedAt.Time()))
	if claims.Instance != "vm-i" || len(claims.Audience) != 1 {
		t.Errorf("vm-i's identity token names instance %q for audiences %v, want vm-i for [%s]", claims.Instance, claims.Audience, imdsAudience)
	}
	if ttl := claims.Expiry.Time().Sub(claims.IssuedAt.Time()); ttl != 5*time.Minute {
		t.Errorf("vm-i's identity token is valid %s, want 5m", ttl)
	}
	if !strings.Contains(g.stderr.String(), "workload token answered") {
		t.Errorf("bcgw did not log the workload token it answered:\n%s", g.stderr.String())
	}

	// A machine on the bridge that is no instance gets nothing, with or
	// without the guest's session token.
	other := os.Getenv(otherEnv)
	if code := curl(other, putToken...); code != "403" {
		t.Errorf("a session token for 10.9.0.9, no instance's address: HTTP %s, want 403", code)
	}
	if code := curl(other, "-H", "X-aws-ec2-metadata-token: "+session, url+"/identity-token?audience="+imdsAudience); code != "403" {
		t.Errorf("an identity token for 10.9.0.9 with vm-i's session token: HTTP %s, want 403", code)
	}
	refused := map[string]int{}
	for _, m := range logLines(node.stderr.String(), "imds: refused") {
		if m["reason"] == "the request's source is not an instance of this host" {
			refused[fmt.Sprint(m["source"])]++
		}
	}
	if refused["10.9.0.1"] != 1 || refused["10.9.0.9"] != 2 {
		t.Errorf("the node refused sources that are no instance's %v times, want 10.9.0.1 once and 10.9.0.9 twice:\n%s", refused, node.stderr.String())
	}
	if strings.Contains(node.stderr.String(), session) || strings.Contains(node.stderr.String(), token) {
		t.Error("a token reached the node's log")
	}
}

// logLines answers the JSON log lines of log whose msg is msg.
func logLines(log, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(log, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}
