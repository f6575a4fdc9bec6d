package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/vm/guestimage"
	"github.com/better-compute/bcd/components/vm/libvirttest"
)

// TestMemorySnapshotOfRealGuest: the real Debian guest (guestimage),
// run by an unprivileged bcd node beside a real bcd helper on a real
// libvirtd, writes a random marker to its disk and another to its
// memory only (/dev/shm). `bcgw snapshot --memory` PUTs the archive to
// an https target the test serves on loopback; a new instance restored
// from it with restore_from (memory) on the same node, its source
// removed (it keeps the source's NIC: the guest's memory holds its MAC
// and address), runs "restored", not booted; ssh through `bcgw tunnel
// --instance vm-b --ssh` reads both markers there, and the host key its
// sshd shows differs from the source's and is the one the node put on
// its identity disk (the guest image's hook installed it from vdz).
// Everything runs in a network namespace the test makes, as
// TestSSHToGuestThroughTunnel does.
func TestMemorySnapshotOfRealGuest(t *testing.T) {
	testenv.NeedRoot(t, "it makes a network namespace, creates a user, runs bcd helper and libvirtd as root")
	if !inGuestNetNS(t, "TestMemorySnapshotOfRealGuest", nil) {
		return
	}
	sshBin := testenv.NeedTool(t, "ssh", "openssh-client")
	keygen := testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	img := guestimage.Cached(t)
	d := libvirttest.StartWith(t, libvirttest.Options{ReadOnlyForAll: true})
	l := newLab(t)
	digest, imageURL, pin := fileServer(t, img.Path, img.SHA256)

	// The upload target: what is PUT is kept in a file and served back.
	store := t.TempDir()
	var mu sync.Mutex
	puts := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := filepath.Join(store, filepath.Base(r.URL.Path))
		switch r.Method {
		case http.MethodPut:
			mu.Lock()
			puts++
			mu.Unlock()
			f, err := os.Create(p)
			if err == nil {
				_, err = io.Copy(f, r.Body)
				f.Close()
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
		case http.MethodGet:
			http.ServeFile(w, r, p)
		}
	}))
	t.Cleanup(srv.Close)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	base := sshdtest.Root(t)
	extra := fmt.Sprintf("\n[instances]\naccel = %q\nlibvirt_socket = %q\n", libvirttest.Accel(), d.Socket())
	hn := newHelperNode(t, l, g, base, "bcd-node-host", "", extra)
	// The host build's upload trusts the system's roots: the node gets the
	// target's certificate as SSL_CERT_FILE, beside its configuration
	// (the node account reads nothing of the test's own directory).
	caFile := filepath.Join(base, "etc", "upload-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	helper := hn.root.start("bcd-helper", "helper", "--config", hn.cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	hn.asUser.startEnv([]string{"SSL_CERT_FILE=" + caFile}, "bcd-node", "node", "--config", hn.cfg)
	l.waitNode(g, hn.id, "connected", func(n nodeView) bool { return n.Connected })
	l.bcgw(g, "ssh-ca", hn.id, "--jwks-only")

	key, pub := l.userKey(t, keygen)
	onDisk, inMemory := randHex(t, 16), randHex(t, 16)
	ud := filepath.Join(l.root, "user-data")
	if err := os.WriteFile(ud, []byte("#cloud-config\nruncmd:\n  - ip link set eth0 up\n  - ip addr add 10.9.0.5/24 dev eth0\n"+
		"  - mkdir -p /root/.ssh && echo '"+strings.TrimSpace(string(pub))+"' > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys\n"+
		"  - echo "+onDisk+" > /root/marker && sync\n"+
		"  - echo "+inMemory+" > /dev/shm/marker\n"+
		"  - echo bcd-guest-ready > /dev/ttyS0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "secret", "set", "instance-user-data/alloc_a", "--node", hn.id, "--value-file", ud)
	nic := `"nics":[{"bridge":"br0","mac":"52:54:00:0a:00:05","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]`
	consoleA := d.ReadConsole(t, "vm-a")
	start := time.Now()
	l.bcgw(g, "spec", "patch", hn.id, "--file", l.specFile("vm-a.json", fmt.Sprintf(`{"instances":{
 "images":[{"sha256":%q,"url":%q,"format":"qcow2","spki_pin":%q}],
 "instances":[{"id":"vm-a","allocation":"alloc_a","state":"RUNNING","vcpus":1,"memory_mib":512,"image":%q,"user_data":true,%s}]}}`,
		digest, imageURL, pin, digest, nic)))
	// A restore fetches, checks and unpacks an archive of about a GiB
	// first: minutes on this machine, not waitStatus's 30 s.
	converged := func(what string) {
		t.Helper()
		var st adminapi.StatusView
		for end := time.Now().Add(10 * time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
			if st = l.gwStatus(g, hn.id); section(st, "instances").State == "CONVERGED" && st.ObservedGeneration == st.SpecGeneration {
				return
			}
		}
		b, _ := json.MarshalIndent(st, "", "  ")
		t.Fatalf("%s: not within 10 minutes; bcgw status:\n%s", what, b)
	}
	converged("vm-a running")
	if !consoleA.Wait("bcd-guest-ready", 12*time.Minute) {
		t.Fatalf("vm-a: no bcd-guest-ready on its console within 12 minutes:\n%s", consoleA.String())
	}
	t.Logf("vm-a: its user data ran %s after the spec", time.Since(start).Round(time.Second))

	// ssh through the instance tunnel; the host key the client was shown
	// is what a fresh known_hosts file holds afterwards.
	ssh := func(instance, command string) (string, string, error) {
		kh := filepath.Join(l.root, "known_hosts-"+randHex(t, 4))
		defer os.Remove(kh)
		proxy := fmt.Sprintf("%s tunnel --instance %s --ssh --data-dir %s", filepath.Join(l.bin, "bcgw"), instance, g.dataDir)
		out, err := exec.Command(sshBin, "-o", "ProxyCommand="+proxy, "-o", "StrictHostKeyChecking=accept-new", "-o", "UserKnownHostsFile="+kh,
			"-o", "HashKnownHosts=no", "-o", "HostKeyAlgorithms=ssh-ed25519", "-o", "BatchMode=yes", "-o", "ConnectTimeout=60",
			"-i", key, "root@"+instance, command).CombinedOutput()
		known, _ := os.ReadFile(kh)
		f := strings.Fields(string(known))
		if len(f) < 3 {
			return string(out), "", err
		}
		return string(out), f[1] + " " + f[2], err
	}
	const show = "cat /root/marker /dev/shm/marker"
	var keyA string
	for end := time.Now().Add(5 * time.Minute); ; time.Sleep(5 * time.Second) {
		out, k, err := ssh("vm-a", show)
		if err == nil && strings.Contains(out, onDisk) && strings.Contains(out, inMemory) {
			keyA = k
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no ssh to vm-a within 5 minutes: %v\n%s", err, out)
		}
	}
	t.Logf("vm-a's host key: %s", keyA)

	sig := "X-Amz-Signature=" + strings.Repeat("beef", 16)
	start = time.Now()
	// Longer than l.bcgw's 2 minutes: the guest's memory is saved under TCG.
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	snap := exec.CommandContext(ctx, filepath.Join(l.bin, "bcgw"), "snapshot", hn.id, "vm-a", "--memory", "--to", srv.URL+"/bucket/vm-a.tar?"+sig, "--data-dir", g.dataDir)
	var snapErr bytes.Buffer
	snap.Stderr = &snapErr
	outb, err := snap.Output()
	out := string(outb)
	var view adminapi.CommandView
	if err != nil || json.Unmarshal(outb, &view) != nil || view.Status != "SUCCEEDED" {
		t.Fatalf("bcgw snapshot --memory: %v\n%s\n%s", err, out, snapErr.String())
	}
	if strings.Contains(out+snapErr.String(), sig) {
		t.Errorf("bcgw snapshot printed the URL's signature:\n%s", out)
	}
	var res struct {
		SHA256 string `json:"sha256"`
		Bytes  int64  `json:"bytes"`
		Memory bool   `json:"memory"`
	}
	json.Unmarshal(view.Output, &res)
	fi, err := os.Stat(filepath.Join(store, "vm-a.tar"))
	if err != nil || fi.Size() != res.Bytes || !res.Memory || puts != 1 {
		t.Fatalf("result %+v; the target holds %v (%v) after %d PUTs", res, fi, err, puts)
	}
	t.Logf("bcgw snapshot --memory of vm-a: %d bytes in %s", res.Bytes, time.Since(start).Round(time.Second))

	// vm-a goes and vm-b, restored from its memory, takes its NIC.
	consoleB := d.ReadConsole(t, "vm-b")
	start = time.Now()
	l.bcgw(g, "spec", "patch", hn.id, "--file", l.specFile("vm-b.json", fmt.Sprintf(`{"instances":{
 "images":[],
 "instances":[{"id":"vm-b","allocation":"alloc_b","state":"RUNNING","vcpus":1,"memory_mib":512,
  "restore_from":{"sha256":%q,"url":%q,"memory":true,"spki_pin":%q},%s}]}}`,
		res.SHA256, srv.URL+"/bucket/vm-a.tar", pki.PinOfCert(srv.Certificate()), nic)))
	converged("vm-b restored")
	t.Logf("vm-b: converged %s after the spec", time.Since(start).Round(time.Second))
	if got, _ := d.Virsh(t, "domstate", "--reason", "vm-b"); strings.TrimSpace(got) != "running (restored)" {
		t.Errorf("vm-b: %q, want running (restored)", strings.TrimSpace(got))
	}
	iso, err := os.ReadFile(filepath.Join(hn.dataDir, "instances", "vm-b", "identity.iso"))
	if err != nil {
		t.Fatalf("vm-b's identity disk: %v", err)
	}
	i := bytes.Index(iso, []byte("ed25519_public: "))
	if i < 0 {
		t.Fatal("vm-b's identity disk carries no public key")
	}
	identity := strings.Join(strings.Fields(string(iso[i+len("ed25519_public: "):]))[:2], " ")

	var outB, keyB string
	for end := time.Now().Add(5 * time.Minute); ; time.Sleep(5 * time.Second) {
		outB, keyB, err = ssh("vm-b", show)
		if err == nil && keyB == identity {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("vm-b: within 5 minutes of its restore its sshd shows %q (its source's %v), not its identity disk's %q: %v\n%s\nits console:\n%s",
				keyB, keyB == keyA, identity, err, outB, consoleB.String())
		}
	}
	t.Logf("vm-b: its own host key %s %s after the spec", keyB, time.Since(start).Round(time.Second))
	if keyB == keyA {
		t.Errorf("vm-b serves vm-a's host key %s", keyA)
	}
	if !strings.Contains(outB, onDisk) || !strings.Contains(outB, inMemory) {
		t.Errorf("vm-b lacks what vm-a wrote (%s on disk, %s in memory):\n%s", onDisk, inMemory, outB)
	}
	if c := consoleB.String(); strings.Contains(c, "bcd-identity:") {
		t.Logf("vm-b's console: %s", c[strings.Index(c, "bcd-identity:"):])
	}
	l.out.assertAbsent(t, "the presigned URL's signature", sig)
}
