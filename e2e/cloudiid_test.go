package e2e

import (
	"bufio"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/testenv"
)

// imdsMockBin is AWS's own IMDS mock (amazon-ec2-metadata-mock), built
// from tools/imdsmock, a module of its own that no role links.
var imdsMockBin struct {
	once sync.Once
	path string
	err  error
}

func buildIMDSMock(t testing.TB) string {
	t.Helper()
	imdsMockBin.once.Do(func() {
		imdsMockBin.path = filepath.Join(build(t), "ec2-metadata-mock")
		cmd := exec.Command("go", "build", "-trimpath", "-o", imdsMockBin.path, "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock")
		cmd.Dir = filepath.Join("..", "tools", "imdsmock")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			imdsMockBin.err = fmt.Errorf("building tools/imdsmock: %v\n%s", err, out)
		}
	})
	if imdsMockBin.err != nil {
		t.Fatal(imdsMockBin.err)
	}
	return imdsMockBin.path
}

// iidNetns makes a network namespace with loopback up and
// 169.254.169.254 on a veth pair's end inside it (this kernel has no
// dummy interfaces), removed when the test ends.
func iidNetns(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t, "a network namespace with 169.254.169.254 for the IMDS mock")
	ip := testenv.NeedTool(t, "ip", "iproute2")
	ns := fmt.Sprintf("bcd-iid-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	_ = exec.Command(ip, "netns", "del", ns).Run()
	run("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	run("-n", ns, "link", "set", "lo", "up")
	run("-n", ns, "link", "add", "name", "imds", "type", "veth", "peer", "name", "imds-peer")
	run("-n", ns, "addr", "add", "169.254.169.254/32", "dev", "imds")
	run("-n", ns, "link", "set", "imds", "up")
	run("-n", ns, "link", "set", "imds-peer", "up")
	return ns
}

// inNetns runs f on a thread that is in the network namespace ns, so the
// sockets f makes are there.
func inNetns(t *testing.T, ns string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("open netns %s: %v", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			t.Errorf("setns %s: %v", ns, err)
			return
		}
		f()
	}()
	<-done
}

// nsProc starts bin with args in the network namespace ns until the test
// ends.
func (l *lab) nsProc(ns string, env []string, bin string, args ...string) *proc {
	l.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	se := &syncBuf{name: filepath.Base(bin) + " (stderr, netns)"}
	so := &syncBuf{name: filepath.Base(bin) + " (stdout, netns)"}
	l.out.add(se)
	l.out.add(so)
	cmd.Stdout, cmd.Stderr = so, se
	if err := cmd.Start(); err != nil {
		l.t.Fatalf("start %s: %v", bin, err)
	}
	p := &proc{cmd: cmd, stderr: se, stdout: so, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	l.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if l.t.Failed() {
			l.t.Logf("%s stderr:\n%s\nstdout:\n%s", bin, se.String(), so.String())
		}
	})
	return p
}

// awsStandIn is the test's stand-in for AWS's document-signing
// certificate: the mock serves a fixed placeholder signature that no key
// made, so the test signs the document the mock serves with its own RSA
// key, gives the mock that signature, and bcgw pins this certificate.
type awsStandIn struct {
	key      *rsa.PrivateKey
	certFile string
}

func newAWSStandIn(t *testing.T, dir, name string) awsStandIn {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	a := awsStandIn{key: k, certFile: filepath.Join(dir, name+".pem")}
	if err := os.WriteFile(a.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return a
}

func (a awsStandIn) sign(t *testing.T, doc []byte) string {
	t.Helper()
	sum := sha256.Sum256(doc)
	sig, err := rsa.SignPKCS1v15(rand.Reader, a.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

// imdsMock runs AWS's mock in ns on 169.254.169.254:80, IMDSv2 only,
// serving an identity document for account and instance, launched then,
// and signature (the mock's own placeholder when empty).
type imdsMock struct {
	l   *lab
	ns  string
	bin string
	p   *proc
}

func (m *imdsMock) start(account, instance string, launched time.Time, signature string) {
	t := m.l.t
	t.Helper()
	if m.p != nil {
		_ = m.p.cmd.Process.Kill()
		<-m.p.done
	}
	values := map[string]any{
		"instance-identity-document": map[string]any{
			"accountId": account, "instanceId": instance, "region": "us-east-1", "availabilityZone": "us-east-1a",
			"instanceType": "m5.large", "imageId": "ami-0123456789abcdef0", "architecture": "x86_64",
			"privateIp": "10.0.0.5", "version": "2017-09-30", "pendingTime": launched.UTC().Format(time.RFC3339),
		},
	}
	if signature != "" {
		values["instance-identity-signature"] = signature
	}
	b, _ := json.Marshal(map[string]any{"dynamic": map[string]any{"values": values}})
	cfg := filepath.Join(m.l.root, "aemm-config.json")
	if err := os.WriteFile(cfg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m.p = m.l.nsProc(m.ns, []string{"HOME=" + m.l.root}, m.bin, "-c", cfg, "-n", "169.254.169.254", "-p", "80", "-I")
	for end := time.Now().Add(20 * time.Second); ; {
		if _, err := m.document(); err == nil {
			return
		} else if time.Now().After(end) {
			t.Fatalf("the IMDS mock does not answer: %v\n%s", err, m.p.stdout.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// document reads the identity document the mock serves, over IMDSv2
// from inside the namespace, as bcd join does. Each request dials and runs
// on the thread inNetns moved (an http.Transport would dial from another
// thread, outside the namespace).
func (m *imdsMock) document() ([]byte, error) {
	var doc []byte
	var err error
	inNetns(m.l.t.(*testing.T), m.ns, func() {
		do := func(method, path string, h http.Header) ([]byte, error) {
			c, err := net.DialTimeout("tcp", "169.254.169.254:80", 2*time.Second)
			if err != nil {
				return nil, err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			req, _ := http.NewRequest(method, "http://169.254.169.254"+path, nil)
			req.Header = h
			if err := req.Write(c); err != nil {
				return nil, err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s %s: HTTP %d", method, path, resp.StatusCode)
			}
			return b, err
		}
		var tok []byte
		if tok, err = do(http.MethodPut, "/latest/api/token", http.Header{"X-Aws-Ec2-Metadata-Token-Ttl-Seconds": {"60"}}); err != nil {
			return
		}
		doc, err = do(http.MethodGet, "/latest/dynamic/instance-identity/document", http.Header{"X-Aws-Ec2-Metadata-Token": {string(tok)}})
	})
	return doc, err
}

// serveSigned starts the mock for account and instance, signed by a.
func (m *imdsMock) serveSigned(a awsStandIn, account, instance string) {
	m.l.t.Helper()
	m.serveSignedAt(a, account, instance, time.Now().Add(-time.Minute))
}

// serveSignedAt is serveSigned for an instance launched then.
func (m *imdsMock) serveSignedAt(a awsStandIn, account, instance string, launched time.Time) {
	m.l.t.Helper()
	m.start(account, instance, launched, "")
	doc, err := m.document()
	if err != nil {
		m.l.t.Fatal(err)
	}
	m.start(account, instance, launched, a.sign(m.l.t.(*testing.T), doc))
	if again, _ := m.document(); string(again) != string(doc) {
		m.l.t.Fatalf("the mock served another document after its restart:\n%s\n%s", doc, again)
	}
}

// fakeSysfs is a DMI tree whose sys_vendor is vendor.
func fakeSysfs(t *testing.T, dir, vendor string) string {
	t.Helper()
	p := filepath.Join(dir, "class", "dmi", "id")
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "sys_vendor"), []byte(vendor+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCloudIIDJoin: in a network namespace with AWS's own IMDS mock at
// 169.254.169.254 (IMDSv2 only), bcd join --attestor cloud-iid joins with
// the mock's identity document when bcgw pins the certificate that signed
// it and a rule admits the account; the same document again, a document
// for another account, one of an instance launched longer ago than bcgw's
// --cloud-iid-max-age (24 h), one signed by a key bcgw does not pin, and a
// machine whose DMI says it is not EC2 (which asks IMDS nothing) are
// refused; with no IMDS answering, the error names the hop limit.
func TestCloudIIDJoin(t *testing.T) {
	l := newLab(t)
	ns := iidNetns(t)
	mock := &imdsMock{l: l, ns: ns, bin: buildIMDSMock(t)}
	aws := newAWSStandIn(t, l.root, "aws-standin")
	other := newAWSStandIn(t, l.root, "not-aws")
	const account, instance = "123456789012", "i-0a1b2c3d4e5f60718"

	gwDir := filepath.Join(l.root, "gw")
	gp := l.nsProc(ns, nil, filepath.Join(l.bin, "bcgw"), "serve", "--data-dir", gwDir, "--listen", "127.0.0.1:0", "--cloud-iid-certs", aws.certFile)
	m := gp.waitLog(t, "bcgw serving", 30*time.Second)
	g := &gw{proc: gp, dataDir: gwDir, addr: m["addr"].(string)}
	if out := l.bcgw(g, "token", "create", "--cloud-iid-account", account, "--region", "us-east-1", "--uses", "5"); !strings.Contains(out, "cloud-iid rule") {
		t.Fatalf("bcgw token create --cloud-iid-account: %s", out)
	}
	pins := strings.Fields(l.bcgw(g, "well-known", "--pins"))
	ec2 := fakeSysfs(t, filepath.Join(l.root, "sys-ec2"), "Amazon EC2")
	join := func(name, sysfs string) (int, string, string) {
		t.Helper()
		dir := filepath.Join(l.root, name)
		args := append([]string{"netns", "exec", ns, filepath.Join(l.bin, "bcd-node"), "join", "--config", filepath.Join(dir, "config.toml"),
			"--server", "https://" + g.addr, "--data-dir", filepath.Join(dir, "data"), "--attestor", "cloud-iid"}, pins...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ip", args...)
		cmd.Env = append(os.Environ(), "BCD_FAKEHW_SYSFS="+sysfs)
		so, se := &syncBuf{name: "bcd join " + name}, &syncBuf{name: "bcd join " + name + " (stderr)"}
		l.out.add(so)
		l.out.add(se)
		cmd.Stdout, cmd.Stderr = so, se
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, so.String(), se.String()
	}

	mock.serveSigned(aws, account, instance)
	code, out, errOut := join("n1", ec2)
	if code != 0 || !joinedRe.MatchString(out) {
		t.Fatalf("cloud-iid join: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(gp.stderr.String(), `"instance":"`+instance+`"`) || !strings.Contains(gp.stderr.String(), `"account":"`+account+`"`) {
		t.Fatal("bcgw logged no node bound to the instance and account")
	}
	for _, c := range []struct {
		name, sysfs string
		setup       func()
		code        int
		want        string
	}{
		{"the same document again", ec2, func() {}, 1, "instance " + instance + " already joined as node_"},
		{"another account", ec2, func() { mock.serveSigned(aws, "210987654321", "i-0ffffffffffffffff") }, 1, "no cloud-iid rule admits account 210987654321"},
		{"launched two days ago", ec2, func() { mock.serveSignedAt(aws, account, "i-0dddddddddddddddd", time.Now().Add(-48*time.Hour)) }, 1, "the identity document is too old"},
		{"signed by a key bcgw does not pin", ec2, func() { mock.serveSigned(other, account, "i-0eeeeeeeeeeeeeeee") }, 1, "does not verify under the pinned certificates"},
		{"DMI says QEMU", fakeSysfs(t, filepath.Join(l.root, "sys-qemu"), "QEMU"), func() {}, 1, `this machine is not an EC2 instance: DMI sys_vendor is "QEMU"`},
		{"no IMDS answering", ec2, func() { _ = mock.p.cmd.Process.Kill(); <-mock.p.done }, 1, "HttpPutResponseHopLimit"},
	} {
		c.setup()
		before := mock.p.stdout.String()
		code, out, errOut := join("refused-"+strings.ReplaceAll(c.name, " ", "-"), c.sysfs)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, want %d with %q\n%s\n%s", c.name, code, c.code, c.want, out, errOut)
		}
		if strings.HasPrefix(c.name, "DMI") && mock.p.stdout.String() != before {
			t.Errorf("%s: bcd join asked IMDS:\n%s", c.name, strings.TrimPrefix(mock.p.stdout.String(), before))
		}
	}
	var nodes []nodeView
	if err := json.Unmarshal([]byte(l.bcgw(g, "nodes", "--json")), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("nodes after the refusals: %v %+v", err, nodes)
	}
}
