package qemutests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
	"github.com/better-compute/bcd/components/trust/wellknown"
	"github.com/better-compute/bcd/images/osimage"
	"github.com/better-compute/bcd/initramfs/osinit"
)

// The TPM test's own network, inside a namespace the test creates: another
// subnet and namespace name than TestPXEBoot's, so the two can run one
// after the other (or side by side).
const (
	tpmBridgeIP = "10.78.0.1"
	tpmGateway  = tpmBridgeIP + ":8443"
	tpmMAC      = "52:54:00:78:00:10"
	tpmSite     = "qemu-tpm"
)

// TestInstalledOSJoinsWithTPM: the test installed OS (images/osimage),
// booted directly from its kernel and initramfs with its disk attached,
// finds /etc/bcd/attestor = tpm on its root partition and runs
// `bcd join --attestor tpm` through a swtpm attached to the VM as tpm-tis
// (the guest kernel's /dev/tpmrm0): no token anywhere. bcgw refuses it
// until the swtpm's EK public key, read on the host, is enrolled (bcgw tpm
// enroll, the same pin the refusal named), then admits it after credential
// activation and lists it connected with the AK the test read from the same
// swtpm state on the host; agent.ping round-trips over the mTLS key held in
// the TPM. A second boot of the same disk and TPM state finds the node
// already joined and reconnects with its key derived again in the TPM; a
// third boot with another TPM does not connect.
func TestInstalledOSJoinsWithTPM(t *testing.T) {
	qemu, image := prerequisites(t)
	if os.Geteuid() != 0 {
		need(t, "root (network namespaces)", errors.New("not root"))
	}
	for _, tool := range []string{"swtpm", "swtpm_setup", "dnsmasq", "debugfs", "e2fsck"} {
		_, err := exec.LookPath(tool)
		need(t, tool+" (apt-get install -y swtpm swtpm-tools dnsmasq-base e2fsprogs)", err)
	}
	kernel, initrd := filepath.Join(image, "vmlinuz"), filepath.Join(image, "os-initramfs.cpio.zst")
	osZst, err := os.ReadFile(filepath.Join(image, "os.img.zst"))
	need(t, "images/out/os.img.zst (make image)", err)
	if _, err := os.Stat(initrd); err != nil {
		need(t, "images/out/os-initramfs.cpio.zst (make image)", err)
	}
	repo := repoRoot(t)
	bin := buildBins(t, repo)
	root := t.TempDir()

	// The TPM: swtpm_setup makes its EK (and EK certificates from a local CA
	// in the test's directory). The test reads the EK public key and the AK
	// on the host through a swtpm on the same state, as an operator would
	// read them on the machine, then lets go of the state.
	state, _ := swtpmtest.SetupEKCerts(t)
	ekFile := filepath.Join(root, "ek.pem")
	akName := readEKAndAK(t, state, ekFile)
	t.Logf("swtpm state %s: AK %s", state, akName)

	ns := makeNetns(t, "bcdtpm", tpmBridgeIP+"/24")
	ns.start(t, nil, "dnsmasq", "--no-daemon", "--port=0", "--interface=br0", "--bind-interfaces", "--user=root",
		"--dhcp-range=10.78.0.100,10.78.0.150,12h", "--no-ping",
		"--dhcp-leasefile="+filepath.Join(root, "leases"), "--pid-file="+filepath.Join(root, "dnsmasq.pid"))
	gwDir := filepath.Join(root, "gw")
	gw := ns.start(t, nil, filepath.Join(bin, "bcgw"), "serve", "--data-dir", gwDir, "--listen", tpmGateway, "--heartbeat", "1s")
	waitFor(t, "bcgw", 30*time.Second, func() bool { return strings.Contains(gw.String(), `"msg":"bcgw serving"`) })
	bcgw := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(bin, "bcgw"), append(args, "--data-dir", gwDir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("bcgw %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	// The disk: the test installed OS, its /etc/bcd written by the test as
	// deploy.image would, with attestor = tpm and no token or node id.
	disk := filepath.Join(root, "os.img")
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := dec.DecodeAll(osZst, nil)
	dec.Close()
	if err != nil {
		t.Fatalf("os.img.zst: %v", err)
	}
	if err := os.WriteFile(disk, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgTOML, jwk := installedOSConfig(t, bcgw("well-known"))
	writeOSFiles(t, disk, []osFile{
		{"/etc/bcd/config.toml", cfgTOML, 0o600},
		{"/etc/bcd/join-encryption.jwk", jwk, 0o644},
		{"/etc/bcd/" + osinit.AttestorFile, []byte("tpm\n"), 0o644},
	})

	type nodeView struct {
		ID        string `json:"id"`
		Role      string `json:"role"`
		Site      string `json:"site"`
		Connected bool   `json:"connected"`
		Epoch     uint64 `json:"epoch"`
		AK        string `json:"ak"`
	}
	nodes := func() []nodeView {
		var ns []nodeView
		if err := json.Unmarshal([]byte(bcgw("nodes", "--json")), &ns); err != nil {
			t.Fatalf("bcgw nodes --json: %v", err)
		}
		return ns
	}
	// connected waits for the node connected with at least epoch, and
	// answers when (since the VM started) and the node.
	connected := func(vm *liveVM, id string, epoch uint64) (time.Duration, nodeView) {
		t.Helper()
		end := time.Now().Add(90 * time.Second)
		for time.Now().Before(end) {
			for _, n := range nodes() {
				if n.ID == id && n.Connected && n.Epoch >= epoch {
					return time.Since(vm.start), n
				}
			}
			if vm.exited() {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		vm.dump(t)
		t.Fatalf("node %s not connected at epoch >= %d (bcgw nodes: %+v)", id, epoch, nodes())
		return 0, nodeView{}
	}
	acc := accel(t)
	qemuArgs := func(sock string) []string {
		return []string{"-machine", "q35", "-accel", acc, "-cpu", "max", "-smp", "1", "-m", "512",
			"-nographic", "-no-reboot",
			"-kernel", kernel, "-initrd", initrd,
			"-append", "console=ttyS0 panic=-1 bcos.root=" + osinit.DefaultRoot,
			"-drive", "file=" + disk + ",if=virtio,format=raw",
			"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", "virtio-net-pci,netdev=n0,mac=" + tpmMAC,
			"-chardev", "socket,id=chrtpm,path=" + sock, "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0"}
	}

	// boot starts a swtpm on st and the VM, and returns both running once
	// settled holds on the console. SeaBIOS allows a TPM command 0.75 to
	// 2 s; when one takes longer (swtpm or QEMU not scheduled on a loaded
	// machine) it disables the owner and endorsement hierarchies until the
	// next TPM2_Startup, and every TPM2_CreatePrimary in the OS fails with
	// TPM_RC_HIERARCHY. Such a boot runs again, at most twice, and says so.
	boot := func(name, st string, settled func(console string) bool) (*liveVM, *vmSWTPM) {
		t.Helper()
		for attempt := 1; ; attempt++ {
			sw := startVMSWTPM(t, st, filepath.Join(root, fmt.Sprintf("swtpm-%s-%d", strings.Fields(name)[0], attempt)))
			vm := startVM(t, ns, qemu, qemuArgs(sw.sock)...)
			if vm.until(150*time.Second, func(c string) bool { return settled(c) || strings.Contains(c, "TPM_RC_HIERARCHY") }) == 0 {
				vm.dump(t)
				t.Fatalf("%s: the console did not get there within 150 s (or QEMU exited)", name)
			}
			if h := vm.at("TPM_RC_HIERARCHY"); h != 0 && attempt < 3 {
				t.Logf("%s, attempt %d: at %v the TPM refused a disabled hierarchy: the firmware's TPM commands timed out under load; booting again", name, attempt, h.Round(100*time.Millisecond))
				vm.stop()
				sw.stop(t)
				continue
			}
			return vm, sw
		}
	}

	// Before the EK is enrolled: the OS's join is refused, naming the EK's
	// pin, and bcgw keeps no node.
	vm, sw := boot("before enrolment", state, func(c string) bool { return strings.Contains(c, "join exited with status") })
	refusedRe := regexp.MustCompile(`Join refused: the TPM's EK (sha256/\S+) is not enrolled`)
	refused := refusedRe.FindStringSubmatch(vm.text())
	if refused == nil || !strings.Contains(vm.text(), "join exited with status 1") {
		vm.dump(t)
		t.Fatal("before enrolment: the join was not refused for the EK")
	}
	tRefused := vm.at("Join refused")
	vm.stop()
	sw.stop(t)
	if got := nodes(); len(got) != 0 {
		t.Fatalf("a refused join left nodes: %+v", got)
	}
	// Enrolled from the host's reading: the pin bcgw computes from it is
	// the one the VM's join was refused for, so the guest's TPM is that
	// swtpm.
	out := bcgw("tpm", "enroll", "--ek-pub", ekFile, "--site", tpmSite)
	if want := "enrolled EK " + refused[1] + " "; !strings.HasPrefix(out, want) {
		t.Fatalf("bcgw tpm enroll printed %q, want it to start %q (the EK the VM's join was refused for)", out, want)
	}
	t.Logf("before enrolment: QEMU start -> join refused for %s %v", refused[1], tRefused.Round(100*time.Millisecond))

	// First boot after enrolment: the OS joins with --attestor tpm.
	joinedRe := regexp.MustCompile(`joined as (\S+) \(site (\S+), role (\S+)\)`)
	joinStep := osinit.Prefix + "starting /bin/bcd join --config /etc/bcd/config.toml --attestor tpm "
	vm, sw = boot("first boot", state, func(c string) bool {
		return joinedRe.MatchString(c) || strings.Contains(c, "join exited with status") || strings.Contains(c, osinit.Prefix+"powering off")
	})
	tInit := vm.at(osinit.Prefix + "init started")
	c := vm.text()
	m := joinedRe.FindStringSubmatch(c)
	if m == nil {
		vm.dump(t)
		t.Fatal("the installed OS did not join with --attestor tpm")
	}
	if !strings.Contains(c, joinStep) {
		vm.dump(t)
		t.Fatalf("the init did not run %q", joinStep)
	}
	id := m[1]
	tJoined := vm.at(m[0])
	if m[2] != tpmSite || m[3] != "node" {
		t.Fatalf("joined as %s in site %s, role %s; want site %s (the EK's enrolment), role node", id, m[2], m[3], tpmSite)
	}
	tConnected, n := connected(vm, id, 1)
	if n.AK != akName || n.Role != "node" || n.Site != tpmSite {
		t.Fatalf("bcgw lists %+v; want role node, site %s, AK %s (the swtpm's)", n, tpmSite, akName)
	}
	table := bcgw("nodes")
	if !strings.Contains(table, akName) {
		t.Fatalf("bcgw nodes does not show the AK %s:\n%s", akName, table)
	}
	t.Logf("bcgw nodes:\n%s", table)
	tPing := time.Now()
	if out := bcgw("run", id, "agent.ping", "--wait", "--timeout", "60s"); !strings.Contains(out, `"SUCCEEDED"`) {
		t.Fatalf("agent.ping on the installed OS: %s", out)
	}
	ping := time.Since(tPing)
	if strings.Contains(c, "join failed; retrying") {
		t.Logf("the join was retried:\n%s", c)
	}
	vm.stop()
	sw.stop(t)
	t.Logf("first boot: QEMU start -> init %v -> joined with --attestor tpm %v -> bcgw lists it connected with its AK %v; agent.ping %v",
		tInit.Round(100*time.Millisecond), tJoined.Round(100*time.Millisecond), tConnected.Round(100*time.Millisecond), ping.Round(10*time.Millisecond))

	// What the join left on the disk: the identity, and node.key naming a
	// key in the TPM (a unique, no private key).
	files := readOSFiles(t, disk, "/var/lib/bcd/"+identity.IdentityFile, "/var/lib/bcd/"+identity.KeyFile)
	if !strings.Contains(files[0], id) {
		t.Errorf("identity.json on the disk does not name %s: %q", id, files[0])
	}
	if !strings.HasPrefix(files[1], `{"tpm":{"unique":"`) || strings.Contains(files[1], "PRIVATE KEY") {
		t.Errorf("node.key on the disk is %q, want the record of a key in the TPM", files[1])
	}

	// Second boot, same disk and TPM state: already joined, and the node
	// key is derived again in the TPM for the new session.
	vm, sw = boot("second boot", state, func(c string) bool {
		return strings.Contains(c, "already joined as "+id) || strings.Contains(c, "join exited with status") || strings.Contains(c, osinit.Prefix+"powering off")
	})
	tAgain := vm.at("already joined as " + id)
	if tAgain == 0 {
		vm.dump(t)
		t.Fatalf("the second boot did not find itself joined as %s", id)
	}
	tBack, n2 := connected(vm, id, n.Epoch+1)
	if n2.AK != akName {
		t.Fatalf("after the second boot bcgw lists AK %q, want %s", n2.AK, akName)
	}
	if out := bcgw("run", id, "agent.ping", "--wait", "--timeout", "60s"); !strings.Contains(out, `"SUCCEEDED"`) {
		t.Fatalf("agent.ping after the second boot: %s", out)
	}
	if got := len(nodes()); got != 1 {
		t.Errorf("bcgw lists %d nodes after two boots, want 1", got)
	}
	vm.stop()
	sw.stop(t)
	t.Logf("second boot: QEMU start -> already joined %v -> connected again (epoch %d) %v",
		tAgain.Round(100*time.Millisecond), n2.Epoch, tBack.Round(100*time.Millisecond))

	// Third boot, same disk with another TPM (a fresh swtpm state): the
	// node key was in the first TPM, so this one derives another key for
	// the unique node.key records, and bcd node refuses to start rather
	// than connect.
	nodeExit := regexp.MustCompile(`bcd node exited with status (\d+)`)
	vm, sw = boot("third boot", t.TempDir(), func(c string) bool {
		return nodeExit.MatchString(c) || strings.Contains(c, osinit.Prefix+"powering off")
	})
	c = vm.text()
	if !nodeExit.MatchString(c) {
		vm.dump(t)
		t.Fatal("with another TPM the node did not stop")
	}
	if code := nodeExit.FindStringSubmatch(c)[1]; code == "0" || !strings.Contains(c, "the TPM derives another key for this unique than node.key records") {
		vm.dump(t)
		t.Fatalf("with another TPM bcd node exited with status %s, want a refusal of the key", code)
	}
	for _, x := range nodes() {
		if x.ID == id && x.Epoch != n2.Epoch {
			t.Fatalf("with another TPM the node opened a session (epoch %d, was %d)", x.Epoch, n2.Epoch)
		}
	}
	vm.stop()
	sw.stop(t)
	t.Logf("third boot, another TPM: bcd node refused the key at %v", vm.at("bcd node exited with status").Round(100*time.Millisecond))
}

// readEKAndAK starts a swtpm on state over loopback TCP, writes its EK
// public key to file (PEM, as bcgw tpm enroll --ek-pub reads it), answers
// its AK's TPM name in hex, and stops the swtpm.
func readEKAndAK(t *testing.T, state, file string) string {
	t.Helper()
	sw := swtpmtest.Start(t, state)
	defer sw.Stop()
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	ek, err := tp.EKPublicPEM()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, ek, 0o644); err != nil {
		t.Fatal(err)
	}
	akPub, err := tp.AKPublic()
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(join.AKName(akPub))
}

// installedOSConfig renders the installed OS's config.toml from bcgw's
// well-known document (gateway, server name, the three pins, the site),
// as deploy.image does from the ramdisk's boot parameters, and answers it
// with the join encryption key (JWK).
func installedOSConfig(t *testing.T, doc string) (cfgTOML, jwkJSON []byte) {
	t.Helper()
	d, jwk, err := wellknown.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("bcgw well-known: %v", err)
	}
	c, err := config.Parse(nil, config.DefaultPath)
	if err != nil {
		t.Fatal(err)
	}
	c.Gateway, c.GatewayServerName = "https://"+tpmGateway, d.Gateway.ServerName
	c.ServingCASPKIPin, c.JoinSigningKeyPin, c.JoinEncryptionKeyPin = d.Pins.ServingCA, d.Pins.JoinSigning, d.Pins.JoinEncryption
	c.Site.Name = tpmSite
	if cfgTOML, err = c.Marshal(); err != nil {
		t.Fatal(err)
	}
	if jwkJSON, err = jwk.MarshalJSON(); err != nil {
		t.Fatal(err)
	}
	return cfgTOML, append(jwkJSON, '\n')
}

// osFile is a file to put into the installed OS's file system.
type osFile struct {
	path string // absolute, in the OS; its directory exists
	data []byte
	mode os.FileMode
}

// partitionImage copies the installed OS's ext4 partition out of disk into
// a file of its own: the lab host's kernel reads no MBR partition table, so
// e2fsprogs work on the partition's bytes.
func partitionImage(t *testing.T, disk string) string {
	t.Helper()
	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) <= osimage.PartitionStart {
		t.Fatalf("%s is %d bytes, no partition at %d", disk, len(b), osimage.PartitionStart)
	}
	p := filepath.Join(t.TempDir(), "part.img")
	if err := os.WriteFile(p, b[osimage.PartitionStart:], 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeOSFiles writes files into the disk's partition 1 without mounting
// it (debugfs -w on a copy of the partition, copied back), and reads each
// back: debugfs exits 0 even when a command fails.
func writeOSFiles(t *testing.T, disk string, files []osFile) {
	t.Helper()
	part := partitionImage(t, disk)
	src := t.TempDir()
	var script strings.Builder
	for i, f := range files {
		// debugfs's write takes the mode (and owner) of the file it copies.
		p := filepath.Join(src, fmt.Sprint(i))
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&script, "cd %s\nwrite %s %s\n", filepath.Dir(f.path), p, filepath.Base(f.path))
	}
	cmds := filepath.Join(src, "debugfs.cmds")
	if err := os.WriteFile(cmds, []byte(script.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("debugfs", "-w", "-f", cmds, part).CombinedOutput(); err != nil {
		t.Fatalf("debugfs -w: %v\n%s", err, out)
	}
	for _, f := range files {
		got, err := exec.Command("debugfs", "-R", "cat "+f.path, part).Output()
		if err != nil || !bytes.Equal(got, f.data) {
			t.Fatalf("%s in the OS's file system after debugfs write: %q %v", f.path, got, err)
		}
		st, _ := exec.Command("debugfs", "-R", "stat "+f.path, part).Output()
		if want := fmt.Sprintf("Mode:  %04o ", f.mode.Perm()); !strings.Contains(string(st), want) {
			t.Fatalf("%s in the OS's file system is not %s:\n%s", f.path, want, st)
		}
	}
	b, err := os.ReadFile(part)
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.WriteAt(b, osimage.PartitionStart); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// readOSFiles reads files from the disk's partition 1 after the VM
// stopped: e2fsck first replays the ext4 journal (the VM was stopped, not
// shut down; debugfs does not replay it).
func readOSFiles(t *testing.T, disk string, paths ...string) []string {
	t.Helper()
	part := partitionImage(t, disk)
	if out, err := exec.Command("e2fsck", "-fy", part).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			t.Fatalf("e2fsck of the installed OS's file system: %v\n%s", err, out)
		}
	}
	var out []string
	for _, p := range paths {
		b, err := exec.Command("debugfs", "-R", "cat "+p, part).Output()
		if err != nil {
			t.Fatalf("debugfs cat %s: %v", p, err)
		}
		out = append(out, string(b))
	}
	return out
}

// vmSWTPM is a swtpm serving one VM: QEMU's tpm emulator backend talks to
// its control channel on a unix socket and hands it the data channel.
type vmSWTPM struct {
	sock string
	cmd  *exec.Cmd
	done chan struct{}
	out  *nsProc
}

// startVMSWTPM starts swtpm on state with its control socket in dir. It
// needs no --flags: QEMU initializes it and the firmware sends
// TPM2_Startup, as on a real machine.
func startVMSWTPM(t *testing.T, state, dir string) *vmSWTPM {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &vmSWTPM{sock: filepath.Join(dir, "swtpm.sock"), done: make(chan struct{}), out: &nsProc{}}
	s.cmd = exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state,
		"--ctrl", "type=unixio,path="+s.sock, "--log", "level=1")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start swtpm: %v", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("swtpm (%s) output:\n%s", s.sock, s.out.String())
		}
	})
	end := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(s.sock); err == nil {
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("swtpm exited at start: %s", s.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(end) {
			t.Fatalf("swtpm made no socket %s within 10s: %s", s.sock, s.out.String())
		}
	}
}

// stop ends swtpm (SIGTERM, so it writes its state; SIGKILL after 10 s).
func (s *vmSWTPM) stop(t *testing.T) {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		t.Logf("swtpm did not end on SIGTERM within 10s: killed")
	}
}

// liveVM is a QEMU process running in the namespace, its serial console
// read in the background (a reader that stops would stall the guest).
type liveVM struct {
	cmd    *exec.Cmd
	start  time.Time
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	lines  []line
}

func startVM(t *testing.T, ns *netns, qemu string, args ...string) *liveVM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	v := &liveVM{cmd: ns.cmd(ctx, qemu, args...), cancel: cancel, done: make(chan struct{})}
	stdout, err := v.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	v.cmd.Stderr = v.cmd.Stdout
	t.Logf("%s %s", qemu, strings.Join(args, " "))
	v.start = time.Now()
	if err := v.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			v.mu.Lock()
			v.lines = append(v.lines, line{time.Since(v.start), strings.TrimRight(sc.Text(), "\r")})
			v.mu.Unlock()
		}
		v.cmd.Wait()
		close(v.done)
	}()
	t.Cleanup(v.stop)
	return v
}

func (v *liveVM) text() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var s strings.Builder
	for _, l := range v.lines {
		s.WriteString(l.text + "\n")
	}
	return s.String()
}

// at answers when the first console line holding substr appeared (since
// QEMU started), or 0.
func (v *liveVM) at(substr string) time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, l := range v.lines {
		if strings.Contains(l.text, substr) {
			return l.at
		}
	}
	return 0
}

func (v *liveVM) exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

// until waits at most d for cond to hold on the console and answers when
// (since QEMU started) it did, or 0 when it did not before d passed or
// QEMU exited.
func (v *liveVM) until(d time.Duration, cond func(console string) bool) time.Duration {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond(v.text()) {
			return time.Since(v.start)
		}
		if v.exited() {
			if cond(v.text()) {
				return time.Since(v.start)
			}
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0
}

// stop kills QEMU (a power cut: the OS has no shutdown command) and waits.
func (v *liveVM) stop() {
	v.cancel()
	<-v.done
}

func (v *liveVM) dump(t *testing.T) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	var s strings.Builder
	for _, l := range v.lines {
		fmt.Fprintf(&s, "%6.2fs %s\n", l.at.Seconds(), l.text)
	}
	t.Logf("serial console:\n%s", s.String())
}
