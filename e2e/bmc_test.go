package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/bmc/redfish/redfishtest"
)

// TestBMCThroughSite: a site agent power-cycles and rotates the password
// of a Redfish BMC (the repo's test BMC on loopback) with credentials bcgw
// hands it only as the secret of the running command; a BMC outside
// [site] bmc_networks is refused; no password reaches any output.
func TestBMCThroughSite(t *testing.T) {
	pw := "s3cr3t-bmc-" + strings.Repeat("p", 12)
	bmc := redfishtest.Start(t, redfishtest.Options{Password: pw})
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--role", "site")
	cfg, site := l.joinNode(g, "site", tok, "site")
	b, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, append(b, []byte("\n[site]\nbmc_networks = [\"127.0.0.0/8\"]\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	l.start("bcd-site", "site", "--config", cfg)
	l.waitNode(g, site, "connected", func(n nodeView) bool { return n.Connected })
	if code, _, errOut := l.run(pw+"\n", nil, "bcgw", "bmc-credentials", "--address", bmc.Addr(), "--username", bmc.Username(), "--data-dir", g.dataDir); code != 0 {
		t.Fatalf("bmc-credentials: %d %s", code, errOut)
	}
	target := fmt.Sprintf(`{"address":%q,"spki_pin":%q}`, bmc.Addr(), bmc.Pin())
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+target+`,"action":"cycle"}`); code != 0 || bmc.Cycles()+len(bmc.Resets()) == 0 {
		t.Fatalf("bmc.power cycle: %d %+v (resets %v)", code, v, bmc.Resets())
	}
	if code, v := l.runKind(g, site, "bmc.rotateCredentials", `{"bmc":`+target+`}`); code != 0 || bmc.Password() == pw {
		t.Fatalf("bmc.rotateCredentials: %d %+v", code, v)
	}
	newPW := bmc.Password()
	// bcgw kept the rotated password: the next command logs in with it.
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+target+`,"action":"status"}`); code != 0 {
		t.Fatalf("bmc.power status after rotation: %d %+v", code, v)
	}
	other := fmt.Sprintf(`{"address":"192.0.2.7:443","spki_pin":%q}`, bmc.Pin())
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+other+`,"action":"status"}`); code != 1 || !strings.Contains(v.Error, "bmc_networks") {
		t.Fatalf("a BMC outside bmc_networks: %d %+v", code, v)
	}
	l.out.assertAbsent(t, "the BMC password", pw)
	l.out.assertAbsent(t, "the rotated BMC password", newPW)
}

// TestBMCLegacyTLS: a BMC that offers only TLS 1.2 with RSA key exchange.
// A command without legacy_tls is refused in the handshake; one with it is
// refused its credentials by bcgw until the BMC is enrolled with
// --legacy-tls, which bcgw's output shows; then the command runs.
func TestBMCLegacyTLS(t *testing.T) {
	pw := "s3cr3t-legacy-" + strings.Repeat("q", 10)
	bmc := redfishtest.Start(t, redfishtest.Options{Password: pw, LegacyTLS: true})
	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	tok := l.token(g, "--uses", "1", "--role", "site")
	cfg, site := l.joinNode(g, "site", tok, "site")
	b, _ := os.ReadFile(cfg)
	if err := os.WriteFile(cfg, append(b, []byte("\n[site]\nbmc_networks = [\"127.0.0.0/8\"]\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	l.start("bcd-site", "site", "--config", cfg)
	l.waitNode(g, site, "connected", func(n nodeView) bool { return n.Connected })
	enroll := func(extra ...string) string {
		args := append([]string{"bmc-credentials", "--address", bmc.Addr(), "--username", bmc.Username(), "--data-dir", g.dataDir}, extra...)
		code, out, errOut := l.run(pw+"\n", nil, "bcgw", args...)
		if code != 0 {
			t.Fatalf("bmc-credentials %v: %d %s", extra, code, errOut)
		}
		return out
	}
	if out := enroll(); strings.Contains(out, "legacy TLS") {
		t.Fatalf("legacy TLS shown although off: %s", out)
	}
	modern := fmt.Sprintf(`{"address":%q,"spki_pin":%q}`, bmc.Addr(), bmc.Pin())
	legacy := fmt.Sprintf(`{"address":%q,"spki_pin":%q,"legacy_tls":true}`, bmc.Addr(), bmc.Pin())
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+modern+`,"action":"status"}`); code != 1 || !strings.Contains(v.Error, "legacy TLS") {
		t.Fatalf("without legacy_tls: %d %+v", code, v)
	}
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+legacy+`,"action":"status"}`); code != 1 || !strings.Contains(v.Error, "not enrolled for legacy TLS") {
		t.Fatalf("legacy_tls without the enrolment: %d %+v", code, v)
	}
	if n := len(bmc.Requests()); n != 0 {
		t.Fatalf("the BMC saw %d requests before the enrolment allowed legacy TLS", n)
	}
	if out := enroll("--legacy-tls"); !strings.Contains(out, "legacy TLS: on") {
		t.Fatalf("bcgw does not show legacy TLS: %s", out)
	}
	if code, v := l.runKind(g, site, "bmc.power", `{"bmc":`+legacy+`,"action":"status"}`); code != 0 {
		t.Fatalf("legacy_tls with the enrolment: %d %+v", code, v)
	}
	l.out.assertAbsent(t, "the BMC password", pw)
}
