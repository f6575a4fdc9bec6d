package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/base/testenv"
)

// otelcolBin is the test collector (tools/otelcol: the collector's own
// OTLP receiver and debug exporter, in its own module so no role links
// it), built once into bin/otelcol and reused while it is there: the
// build takes minutes on two cores.
var otelcolBin struct {
	once sync.Once
	path string
	err  error
}

func otelcol(t testing.TB) string {
	t.Helper()
	otelcolBin.once.Do(func() {
		p, err := filepath.Abs(filepath.Join("..", "bin", "otelcol"))
		if err != nil {
			otelcolBin.err = err
			return
		}
		otelcolBin.path = p
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return
		}
		if _, err := exec.LookPath("go"); err != nil {
			otelcolBin.err = err
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", p, ".")
		cmd.Dir = filepath.Join("..", "tools", "otelcol")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			otelcolBin.err = fmt.Errorf("building tools/otelcol: %v\n%s", err, out)
		}
	})
	if otelcolBin.err != nil {
		testenv.Skip(t, "no OpenTelemetry Collector: %v", otelcolBin.err)
	}
	return otelcolBin.path
}

// collectorTLS writes a CA and a certificate for 127.0.0.1 it signed
// into dir and returns the CA in PEM and the certificate's and key's
// paths.
func collectorTLS(t testing.TB, dir string) (caPEM, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "e2e collector CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "collector.pem"), filepath.Join(dir, "collector.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})), certFile, keyFile
}

// startCollector starts the collector on addr with TLS, the debug
// exporter printing every point, and waits until it serves.
func (l *lab) startCollector(bin, addr, certFile, keyFile string) *proc {
	l.t.Helper()
	cfg := filepath.Join(l.root, "otelcol.yaml")
	body := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      http:
        endpoint: %s
        tls:
          cert_file: %s
          key_file: %s
exporters:
  debug:
    verbosity: detailed
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [debug]
`, addr, certFile, keyFile)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", cfg)
	se := &syncBuf{name: "otelcol (stderr)"}
	so := &syncBuf{name: "otelcol (stdout)"}
	l.out.add(se)
	l.out.add(so)
	cmd.Stdout, cmd.Stderr = so, se
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("start otelcol: %v", err)
	}
	p := &proc{cmd: cmd, stderr: se, stdout: so, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	l.t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.done })
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if strings.Contains(se.String(), "Everything is ready") {
			return p
		}
		select {
		case <-p.done:
			l.t.Fatalf("otelcol exited:\n%s", se.String())
		default:
		}
		if time.Now().After(end) {
			l.t.Fatalf("otelcol not ready within 60s:\n%s", se.String())
		}
	}
}

// received is what the debug exporter printed: per metric name, each
// point's attributes and timestamp, and each batch's resource attributes.
type received struct {
	resources []map[string]string
	points    map[string][]map[string]string // metric -> point attributes (with "@time")
}

// parseDebug reads the debug exporter's detailed output.
func parseDebug(s string) received {
	r := received{points: map[string][]map[string]string{}}
	var (
		mode   string
		metric string
		point  map[string]string
	)
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "Resource attributes:":
			mode = "resource"
			r.resources = append(r.resources, map[string]string{})
		case strings.HasPrefix(line, "Descriptor:"):
			mode = "descriptor"
		case strings.HasPrefix(line, "NumberDataPoints #"):
			mode = "point"
			point = map[string]string{}
			r.points[metric] = append(r.points[metric], point)
		case strings.HasPrefix(line, "Data point attributes:"):
		case strings.HasPrefix(line, "Timestamp: ") && mode == "point":
			point["@time"] = strings.TrimPrefix(line, "Timestamp: ")
		case strings.HasPrefix(line, "-> "):
			k, v, ok := strings.Cut(strings.TrimPrefix(line, "-> "), ": ")
			if !ok {
				continue
			}
			v = strings.TrimSuffix(strings.TrimPrefix(v, "Str("), ")")
			switch mode {
			case "resource":
				r.resources[len(r.resources)-1][k] = v
			case "descriptor":
				if k == "Name" {
					metric = v
				}
			case "point":
				point[k] = v
			}
		case strings.HasPrefix(line, "ScopeMetrics #"), strings.HasPrefix(line, "Metric #"):
			mode = ""
		}
	}
	return r
}

// gpus is how many GPUs (distinct gpu.uuid) the bcd.gpu.* points name.
func (r received) gpus() int {
	uuids := map[string]bool{}
	for name, ps := range r.points {
		if !strings.HasPrefix(name, "bcd.gpu.") {
			continue
		}
		for _, p := range ps {
			if u := p["gpu.uuid"]; u != "" {
				uuids[u] = true
			}
		}
	}
	return len(uuids)
}

func nodeStatus(t testing.TB, l *lab, cfg string) status.Snapshot {
	t.Helper()
	code, out, errOut := l.run("", nil, "bcd-node", "status", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("bcd status: exit %d: %s", code, errOut)
	}
	var s status.Snapshot
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTelemetryToRealCollector: a fakehw node with a telemetry section
// exports to an OpenTelemetry Collector built from the collector's own
// modules, on loopback TLS under a CA only the spec names. The collector
// prints bcd.gpu.* for the node's 8 GPUs with the node's resource
// attributes, and bcd status shows the last export. The collector is
// then killed for $BCD_TELEMETRY_GAP (default 10s; 60s for the issue's
// run) and started again: the node's RSS stays within 16 MiB of what it
// was, the gap's points are delivered (the buffer holds them) or counted
// as dropped, and export resumes.
func TestTelemetryToRealCollector(t *testing.T) {
	gap := 10 * time.Second
	if v := os.Getenv("BCD_TELEMETRY_GAP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("BCD_TELEMETRY_GAP=%q is not a positive Go duration", v)
		}
		gap = d
	}
	col := otelcol(t)
	l := newLab(t)
	ca, certFile, keyFile := collectorTLS(t, l.root)
	addr := freeAddr(t)
	c1 := l.startCollector(col, addr, certFile, keyFile)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	node := l.start("bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })
	spec, _ := json.Marshal(map[string]any{"telemetry": map[string]any{
		"endpoint": "https://" + addr, "interval_s": 1, "ca_pem": ca,
		"resource": map[string]string{"deployment.environment": "e2e"},
	}})
	l.spec(g, "set", id, string(spec))

	var first received
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		first = parseDebug(c1.stderr.String())
		if first.gpus() >= 8 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the collector printed %d GPUs within 60s:\n%s", first.gpus(), node.stderr.String())
		}
	}
	if n := first.gpus(); n != 8 {
		t.Fatalf("bcd.gpu.* names %d GPUs, want 8", n)
	}
	res := first.resources[0]
	if res["bcd.node.id"] != id || res["bcd.role"] != "node" || res["deployment.environment"] != "e2e" || res["service.name"] != "bcd" {
		t.Fatalf("resource attributes %v", res)
	}
	for _, name := range []string{"bcd.gpu.utilization", "bcd.gpu.temperature", "bcd.gpu.power.draw", "bcd.gpu.memory.used", "bcd.gpu.ecc.errors",
		"bcd.gpu.xid.count", "bcd.gpu.held", "bcd.host.memory.available", "bcd.host.session.connected", "bcd.host.certificate.expiry", "bcd.instances.complete"} {
		if len(first.points[name]) == 0 {
			t.Errorf("the collector has no %s", name)
		}
	}
	st := nodeStatus(t, l, cfg)
	if st.Telemetry == nil || st.Telemetry.LastExport.IsZero() || st.Telemetry.Endpoint != "https://"+addr {
		t.Fatalf("bcd status telemetry: %+v", st.Telemetry)
	}
	if _, out, _ := l.run("", nil, "bcd-node", "status", "--config", cfg); !strings.Contains(out, "telemetry   https://"+addr+", last export 20") {
		t.Fatalf("bcd status has no telemetry line:\n%s", out)
	}
	if _, out, _ := l.run("", nil, "bcd-node", "doctor", "--config", cfg); !strings.Contains(out, "takes a trusted TLS connection") {
		t.Fatalf("bcd doctor with the collector up:\n%s", out)
	}

	// A site agent has the section too, with the agent's own metrics.
	siteCfg, siteID := l.joinNode(g, "s", l.token(g, "--uses", "1", "--role", "site", "--site", "fra1"), "site")
	site := l.start("bcd-site", "site", "--config", siteCfg)
	l.waitNode(g, siteID, "connected", func(n nodeView) bool { return n.Connected })
	l.spec(g, "patch", siteID, string(spec))
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := parseDebug(c1.stderr.String())
		found := false
		for _, res := range r.resources {
			found = found || (res["bcd.node.id"] == siteID && res["bcd.role"] == "site" && res["bcd.site"] == "fra1")
		}
		if found {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no export of the site agent within 60s:\n%s", site.stderr.String())
		}
	}
	site.signal(syscall.SIGTERM)

	// The collector is killed for the gap.
	pid := node.cmd.Process.Pid
	time.Sleep(3 * time.Second)
	rssBefore := rssKiB(pid)
	c1.signal(syscall.SIGKILL)
	<-c1.done
	killed := time.Now()
	rssPeak := rssBefore
	for time.Since(killed) < gap {
		rssPeak = max(rssPeak, rssKiB(pid))
		time.Sleep(time.Second)
	}
	down := nodeStatus(t, l, cfg).Telemetry
	if down.LastError == "" || down.PendingBatches == 0 {
		t.Fatalf("while the collector is down: %+v", down)
	}
	if _, out, _ := l.run("", nil, "bcd-node", "doctor", "--config", cfg); !strings.Contains(out, "is unreachable") {
		t.Fatalf("bcd doctor with the collector down:\n%s", out)
	}
	c2 := l.startCollector(col, addr, certFile, keyFile)
	restarted := time.Now()
	var after *status.Telemetry
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		after = nodeStatus(t, l, cfg).Telemetry
		if after.PendingBatches == 0 && after.LastExport.After(restarted) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("export did not resume within 2 minutes: %+v", after)
		}
	}
	rssPeak = max(rssPeak, rssKiB(pid))
	// Every second of the gap arrives late, with the time it was taken.
	second := parseDebug(c2.stderr.String())
	inGap := map[string]bool{}
	for _, p := range second.points["bcd.gpu.temperature"] {
		at, err := time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", p["@time"])
		if err == nil && at.After(killed) && at.Before(restarted) {
			inGap[at.Truncate(time.Second).String()] = true
		}
	}
	t.Logf("gap %s: RSS before %.0f KiB, peak %.0f KiB; %d batches (%d bytes) waited; after: %d points exported, %d dropped; %d collections of the gap delivered late",
		gap, rssBefore, rssPeak, down.PendingBatches, down.PendingBytes, after.ExportedPoints, after.DroppedPoints, len(inGap))
	if after.DroppedPoints != 0 {
		t.Errorf("%d points dropped: a gap of %s fits in the buffer", after.DroppedPoints, gap)
	}
	if want := int(gap/time.Second) - 3; len(inGap) < want {
		t.Errorf("%d collections of the gap were delivered, want at least %d", len(inGap), want)
	}
	if rssPeak > rssBefore+16*1024 {
		t.Errorf("the node's RSS grew from %.0f KiB to %.0f KiB while the collector was down", rssBefore, rssPeak)
	}
	if n := second.gpus(); n != 8 {
		t.Errorf("after the restart bcd.gpu.* names %d GPUs", n)
	}
}
