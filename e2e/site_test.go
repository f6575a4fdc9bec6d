package e2e

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/boot/bootparams"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestSiteBootServer: boot.prepareRamdisk pulls the ramdisk's images into
// the site's verified cache, gets a discovery token through a
// SecretRequest, signs the discovery assertion, and the site serves the
// machine's iPXE script (with bc.* parameters that parse) and its images;
// an unknown MAC and a cleaned-up one get `exit`.
func TestSiteBootServer(t *testing.T) {
	kernel, initrd := []byte(strings.Repeat("kernel", 5000)), []byte(strings.Repeat("initrd", 7000))
	iso := []byte(strings.Repeat("CD001", 9000))
	src := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/vmlinuz":
			w.Write(kernel)
		case "/initrd":
			w.Write(initrd)
		case "/installer.iso":
			w.Write(iso)
		default:
			http.NotFound(w, r)
		}
	}))
	defer src.Close()
	l := newLab(t)
	caFile := filepath.Join(l.root, "src-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: src.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--role", "site", "--site", "ams1")
	cfg, site := l.joinNode(g, "site", tok, "site")
	addr := freePort(t)
	b, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, append(b, []byte(fmt.Sprintf("\n[boot]\nlisten = %q\nurl = \"http://%s\"\n", addr, addr))...), 0o600); err != nil {
		t.Fatal(err)
	}
	l.startEnv([]string{"BCD_FAKEHW_EXTRA_CA=" + caFile}, "bcd-site", "site", "--config", cfg)
	l.waitNode(g, site, "holding the lease", func(n nodeView) bool { return n.Connected && n.BootLease })

	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	mac := "52:54:00:12:34:56"
	body := fmt.Sprintf(`{"mac":%q,"kernel":{"sha256":%q,"url":%q},"initrd":{"sha256":%q,"url":%q}}`,
		mac, sum(kernel), src.URL+"/vmlinuz", sum(initrd), src.URL+"/initrd")
	code, v := l.runKind(g, site, "boot.prepareRamdisk", body)
	if code != 0 {
		t.Fatalf("boot.prepareRamdisk: %d %+v", code, v)
	}
	var out struct {
		ScriptURL string `json:"script_url"`
	}
	_ = json.Unmarshal(v.Output, &out)
	get := func(u string) string {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	script := get(out.ScriptURL)
	m := regexp.MustCompile(`(?m)^kernel (\S+) initrd=initrd (.*)$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatalf("script:\n%s", script)
	}
	p, err := bootparams.Parse(m[2])
	if err != nil {
		t.Fatalf("bc.* parameters do not parse: %v", err)
	}
	grantURL := regexp.MustCompile(`^http://` + regexp.QuoteMeta(addr) + `/cache/t/[0-9a-f]{32}$`)
	if p.MAC.String() != mac || p.Site != "ams1" || !strings.HasPrefix(p.DiscoveryToken, "bcjt_") || !grantURL.MatchString(p.CacheURL) {
		t.Fatalf("parameters %+v", p)
	}
	// The assertion is signed by the site agent's key.
	idb, _ := os.ReadFile(filepath.Join(filepath.Dir(cfg), "data", "identity.json"))
	var id struct {
		CertificatePEM string `json:"certificate_pem"`
	}
	_ = json.Unmarshal(idb, &id)
	blk, _ := pem.Decode([]byte(id.CertificatePEM))
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := jose.ParseSigned(p.Assertion, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		t.Fatal(err)
	}
	payload, err := jws.Verify(cert.PublicKey)
	if err != nil || !strings.Contains(string(payload), site) || !strings.Contains(string(payload), mac) {
		t.Fatalf("assertion: %v %s", err, payload)
	}
	ramdiskJoins(t, l, g, m[2], mac)
	if got := get(m[1]); got != string(kernel) || !strings.HasPrefix(m[1], p.CacheURL+"/images/") {
		t.Fatalf("kernel from the site's cache at %s: %d bytes, want %d under the machine's grant %s", m[1], len(got), len(kernel), p.CacheURL)
	}
	// Nothing is served without a grant: not the old path, not another
	// grant.
	status := func(u string) int {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, u := range []string{"http://" + addr + "/images/" + sum(kernel), "http://" + addr + "/cache/t/" + strings.Repeat("0", 32) + "/images/" + sum(kernel),
		"http://" + addr + "/cache/t/x/images/" + sum(kernel)} {
		if c := status(u); c != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404 (no grant)", u, c)
		}
	}
	if s := get("http://" + addr + "/boot/ipxe?mac=52:54:00:00:00:01"); !strings.Contains(s, "exit") || strings.Contains(s, "kernel") || strings.Contains(s, "/cache/") {
		t.Fatalf("unknown MAC got:\n%s", s)
	}
	// The site reports it, and bcgw discovered lists it.
	var disc []adminapi.DiscoveredView
	end := time.Now().Add(20 * time.Second)
	for time.Now().Before(end) && len(disc) == 0 {
		if code, out, _ := l.run("", nil, "bcgw", "discovered", site, "--json", "--data-dir", g.dataDir); code == 0 {
			json.Unmarshal([]byte(out), &disc)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(disc) != 1 || disc[0].MAC != "52:54:00:00:00:01" || disc[0].Count != 1 {
		t.Errorf("bcgw discovered: %+v", disc)
	}
	if code, out, _ := l.run("", nil, "bcgw", "discovered", site, "--data-dir", g.dataDir); code != 0 || !strings.Contains(out, "52:54:00:00:00:01") {
		t.Errorf("bcgw discovered (text): %d %s", code, out)
	}
	// Another machine's assertion (validly signed, for another token and
	// MAC) does not admit this one.
	mac2 := "52:54:00:65:43:21"
	body2 := strings.Replace(body, mac, mac2, 1)
	if code, v := l.runKind(g, site, "boot.prepareRamdisk", body2); code != 0 {
		t.Fatalf("boot.prepareRamdisk 2: %+v", v)
	}
	m2 := regexp.MustCompile(`(?m)^kernel (\S+) initrd=initrd (.*)$`).FindStringSubmatch(get("http://" + addr + "/boot/ipxe?mac=" + mac2))
	swapped := regexp.MustCompile(`bc.assertion=\S+`).ReplaceAllString(m2[2], "bc.assertion="+p.Assertion)
	cl := filepath.Join(l.root, "cmdline-swapped")
	if err := os.WriteFile(cl, []byte(swapped), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := l.run("", nil, "bcd-ramdisk", "ramdisk", "--cmdline", cl, "--data-dir", filepath.Join(l.root, "r5")); code != 1 || !strings.Contains(errOut, "discovery assertion") {
		t.Fatalf("another machine's assertion: exit %d %q", code, errOut)
	}
	// boot.prepareISO: the machine sanboots an ISO from the cache, under
	// its own grant.
	mac3 := "52:54:00:aa:bb:cc"
	if code, v := l.runKind(g, site, "boot.prepareISO", fmt.Sprintf(`{"mac":%q,"iso":{"sha256":%q,"url":%q}}`, mac3, sum(iso), src.URL+"/installer.iso")); code != 0 {
		t.Fatalf("boot.prepareISO: %+v", v)
	}
	isoScript := get("http://" + addr + "/boot/ipxe?mac=" + mac3)
	mi := regexp.MustCompile(`(?m)^sanboot --no-describe (http://\S+/cache/t/[0-9a-f]{32}/images/` + sum(iso) + `) `).FindStringSubmatch(isoScript)
	if mi == nil || strings.Contains(isoScript, "bc.") {
		t.Fatalf("the ISO machine's script:\n%s", isoScript)
	}
	if got := get(mi[1]); got != string(iso) {
		t.Errorf("the ISO from the cache: %d bytes, want %d", len(got), len(iso))
	}
	if code, v := l.runKind(g, site, "boot.cleanUp", `{"mac":"`+mac+`"}`); code != 0 {
		t.Fatalf("boot.cleanUp: %+v", v)
	}
	if s := get(out.ScriptURL); strings.Contains(s, "kernel") {
		t.Fatalf("cleaned-up MAC still boots:\n%s", s)
	}
	if c := status(m[1]); c != http.StatusNotFound {
		t.Errorf("the cleaned-up machine's grant still reads the cache: %d", c)
	}
	// A wrong digest is never cached nor served.
	bad := fmt.Sprintf(`{"mac":"52:54:00:00:00:02","kernel":{"sha256":%q,"url":%q},"initrd":{"sha256":%q,"url":%q}}`,
		sum([]byte("other")), src.URL+"/vmlinuz", sum(initrd), src.URL+"/initrd")
	if code, v := l.runKind(g, site, "boot.prepareRamdisk", bad); code != 1 || !strings.Contains(v.Error, "pull") {
		t.Fatalf("wrong digest: %d %+v", code, v)
	}
	if c := status(m2[1][:strings.Index(m2[1], "/images/")] + "/images/" + sum([]byte("other"))); c != http.StatusNotFound {
		t.Fatalf("a mismatched image is served: %d", c)
	}
	// cache_images: the site warms what its desired state names and
	// reports the images section and READY (or the failure).
	if code, _, errOut := l.run("", nil, "bcgw", "cache-images", site, "--image", sum(initrd)+"="+src.URL+"/initrd", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("cache-images: %s", errOut)
	}
	// cached reports whether the images section lists the initrd READY.
	cached := func(st map[string]any) bool {
		ims, _ := st["images"].([]any)
		for _, im := range ims {
			m, _ := im.(map[string]any)
			if m["digest"] == sum(initrd) && m["state"] == "READY" {
				return true
			}
		}
		return false
	}
	waitStatus := func(want string, and func(map[string]any) bool) map[string]any {
		var st map[string]any
		end := time.Now().Add(30 * time.Second)
		for time.Now().Before(end) {
			code, out, _ := l.run("", nil, "bcgw", "status", site, "--json", "--data-dir", g.dataDir)
			var view struct {
				Report map[string]any `json:"report"`
			}
			if code == 0 && json.Unmarshal([]byte(out), &view) == nil {
				st = view.Report
				if sect, _ := st["site"].(map[string]any); sect != nil && strings.HasPrefix(fmt.Sprint(sect["cache_images"]), want) && and(st) {
					return st
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Fatalf("no status with cache_images %s: %v", want, st)
		return nil
	}
	// cache_images READY with the initrd cached (before the site section
	// converges the report says READY for the nothing it was asked before).
	waitStatus("READY", cached)
	if code, _, errOut := l.run("", nil, "bcgw", "cache-images", site, "--image", sum([]byte("nope"))+"="+src.URL+"/vmlinuz", "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("cache-images: %s", errOut)
	}
	waitStatus("FAILED", func(map[string]any) bool { return true })
	l.out.assertAbsent(t, "the discovery token", p.DiscoveryToken)
	l.out.assertAbsent(t, "the site's join token", tok)
}

// TestSiteBootRefusals: the exit codes (docs/configuration.md) for a [boot] section that
// cannot work.
func TestSiteBootRefusals(t *testing.T) {
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--role", "site")
	cfg, _ := l.joinNode(g, "site", tok, "site")
	base, _ := os.ReadFile(cfg)
	write := func(boot string) {
		if err := os.WriteFile(cfg, append(append([]byte{}, base...), []byte("\n[boot]\n"+boot)...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("listen = \"127.0.0.1:0\"\nurl = \"http://127.0.0.1:1\"\nproxy_dhcp = true\n")
	if code, _, errOut := l.run("", nil, "bcd-site", "site", "--config", cfg); code != 2 || !strings.Contains(errOut, "server_ip and url") {
		t.Fatalf("proxy_dhcp without server_ip: exit %d %q", code, errOut)
	}
	write("listen = \"127.0.0.1:0\"\nurl = \"http://127.0.0.1:1\"\n")
	if err := os.Remove(filepath.Join(filepath.Dir(cfg), "join-encryption.jwk")); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := l.run("", nil, "bcd-site", "site", "--config", cfg); code != 1 || !strings.Contains(errOut, "join-encryption.jwk") {
		t.Fatalf("no join-encryption.jwk: exit %d %q", code, errOut)
	}
}

// ramdiskJoins runs bcd ramdisk on the command line the site served: it
// joins with the discovery attestor as role ramdisk and runs the agent; the
// same parameters cannot join a second machine, a forged assertion and a
// jwk that does not match its pin are refused.
func ramdiskJoins(t *testing.T, l *lab, g *gw, cmdline, mac string) {
	t.Helper()
	dir := filepath.Join(l.root, "ramdisk")
	cl := filepath.Join(l.root, "cmdline")
	if err := os.WriteFile(cl, []byte("BOOT_IMAGE=vmlinuz "+cmdline+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := l.start("bcd-ramdisk", "ramdisk", "--cmdline", cl, "--data-dir", dir)
	m := p.waitLog(t, "joined", 30*time.Second)
	id, _ := m["node"].(string)
	n := l.waitNode(g, id, "connected as a ramdisk", func(n nodeView) bool { return n.Connected })
	if n.Role != "ramdisk" {
		t.Fatalf("ramdisk joined with role %s", n.Role)
	}
	if code, v := l.runKind(g, id, "agent.ping", ""); code != 0 || !strings.Contains(string(v.Output), "ramdisk") {
		t.Fatalf("agent.ping on the ramdisk: %d %+v", code, v)
	}
	// The ramdisk kinds are wired: a wipe of something that is not a block
	// device is refused, and the kinds of other roles are not there.
	if code, v := l.runKind(g, id, "disk.wipe", `{"devices":["`+cl+`"],"mode":"quick"}`); code != 1 || !strings.Contains(v.Error, "not a block device") {
		t.Fatalf("disk.wipe of a file: %d %+v", code, v)
	}
	if code, v := l.runKind(g, id, "gpu.reset", `{"gpu":"0"}`); code != 1 || v.Status != "UNSUPPORTED" {
		t.Fatalf("a node kind on the ramdisk: %d %+v", code, v)
	}
	// The token is spent: a second machine with the same parameters is refused.
	code, _, errOut := l.run("", nil, "bcd-ramdisk", "ramdisk", "--cmdline", cl, "--data-dir", filepath.Join(l.root, "ramdisk2"))
	if code != 1 || !strings.Contains(errOut, "Join refused") {
		t.Fatalf("replayed discovery token: exit %d %q", code, errOut)
	}
	// Malformed parameters exit 2; a jwk of another key exits 1.
	if err := os.WriteFile(cl, []byte("bc.gateway=https://x bc.mac=zz\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := l.run("", nil, "bcd-ramdisk", "ramdisk", "--cmdline", cl, "--data-dir", filepath.Join(l.root, "r3")); code != 2 || !strings.Contains(errOut, "bc.") {
		t.Fatalf("malformed bc.*: exit %d %q", code, errOut)
	}
	other := regexp.MustCompile(`bc.encryption_pin=\S+`).ReplaceAllString(cmdline, "bc.encryption_pin=sha256/"+strings.Repeat("A", 43)+"=")
	if err := os.WriteFile(cl, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := l.run("", nil, "bcd-ramdisk", "ramdisk", "--cmdline", cl, "--data-dir", filepath.Join(l.root, "r4")); code != 1 || !strings.Contains(errOut, "bc.jwk does not match the join encryption pin") {
		t.Fatalf("jwk not matching its pin: exit %d %q", code, errOut)
	}
}
