package e2e

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestSiteHTTPProxy: site.httpProxy on a real site agent refuses a
// loopback and a public address before sending anything (a server on the
// loopback sees no request), also when a name resolves to loopback; a
// secret header travels as a secret bound to the command (the site asks
// for it, bcgw answers) and shows in no output; a secret header for
// another kind is refused.
func TestSiteHTTPProxy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, site := l.joinNode(g, "site", l.token(g, "--uses", "1", "--role", "site", "--site", "ams1"), "site")
	l.start("bcd-site", "site", "--config", cfg)
	l.waitNode(g, site, "connected", func(n nodeView) bool { return n.Connected })

	for url, want := range map[string]string{
		"http://127.0.0.1:" + port + "/redfish/v1": "127.0.0.1 is a loopback address",
		"http://192.0.2.10/redfish/v1":             "192.0.2.10 is not a site-internal address",
		"http://169.254.169.254/latest/meta-data/": "link-local",
	} {
		code, v := l.runKind(g, site, "site.httpProxy", `{"url":"`+url+`"}`)
		if code == 0 || v.Status != "FAILED" || !strings.Contains(v.Error, want) {
			t.Errorf("site.httpProxy %s: exit %d %+v, want %q", url, code, v, want)
		}
	}

	const secret = "Basic ZTJlLXNlY3JldC12YWx1ZQ=="
	sf := filepath.Join(l.root, "auth")
	os.WriteFile(sf, []byte(secret+"\n"), 0o600)
	code, out, errOut := l.run("", nil, "bcgw", "run", site, "site.httpProxy", "--wait", "--data-dir", g.dataDir,
		"--body", `{"url":"http://localhost:`+port+`/redfish/v1","secret_headers":["Authorization"],"timeout_seconds":5}`,
		"--secret-header", "Authorization="+sf)
	if code == 0 || !strings.Contains(out, "loopback") {
		t.Errorf("site.httpProxy to a name for the loopback: exit %d %s %s", code, out, errOut)
	}
	if !strings.Contains(g.stderr.String(), `"msg":"secret answered"`) || !strings.Contains(g.stderr.String(), `"name":"http-header/Authorization"`) {
		t.Errorf("bcgw did not answer the secret header:\n%s", g.stderr.String())
	}
	if hits.Load() != 0 {
		t.Errorf("a refused address was reached %d times", hits.Load())
	}
	// A secret header goes with site.httpProxy only.
	if code, _, errOut := l.run("", nil, "bcgw", "run", site, "agent.ping", "--data-dir", g.dataDir, "--secret-header", "Authorization="+sf); code == 0 || !strings.Contains(errOut, "secret headers go with site.httpProxy only") {
		t.Errorf("a secret header with agent.ping: exit %d %s", code, errOut)
	}
	l.out.assertAbsent(t, "the secret header", "ZTJlLXNlY3JldC12YWx1ZQ")
}
