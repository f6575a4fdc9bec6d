package qemutests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/u-root/mkuimage/cpio"
	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/boot/bootparams"
	"github.com/better-compute/bcd/images/osimage"
)

// The PXE test's own network, inside a namespace the test creates.
const (
	pxeBridgeIP = "10.77.0.1"
	pxeMAC      = "52:54:00:77:00:10"
)

// netns is a network namespace made by the test.
type netns struct{ name string }

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func newNetns(t *testing.T) *netns {
	return makeNetns(t, "bcdpxe", pxeBridgeIP+"/24", []string{"ip", "-6", "addr", "add", "fd00:77::1/64", "dev", "br0"})
}

// makeNetns makes a network namespace named prefix<pid> with a bridge br0
// on cidr, more commands for it, and a tap (tap0) on the bridge for a VM;
// the namespace is deleted when the test ends.
func makeNetns(t *testing.T, prefix, cidr string, extra ...[]string) *netns {
	t.Helper()
	n := &netns{name: fmt.Sprintf("%s%d", prefix, os.Getpid()%100000)}
	_ = exec.Command("ip", "netns", "del", n.name).Run()
	run(t, "ip", "netns", "add", n.name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.name).Run() })
	cmds := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "addr", "add", cidr, "dev", "br0"},
	}
	cmds = append(cmds, extra...)
	cmds = append(cmds, [][]string{
		{"ip", "tuntap", "add", "tap0", "mode", "tap"},
		{"ip", "link", "set", "tap0", "master", "br0"},
		{"ip", "link", "set", "tap0", "up"},
		{"ip", "link", "set", "br0", "up"},
	}...)
	for _, c := range cmds {
		run(t, "ip", append([]string{"netns", "exec", n.name}, c...)...)
	}
	return n
}

// cmd is a command run inside the namespace.
func (n *netns) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

// listen opens a TCP listener inside the namespace: the socket stays there
// after this thread returns to the test's namespace.
func (n *netns) listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		var fd int
		if fd, err = unix.Open("/run/netns/"+n.name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return
		}
		ln, err = net.Listen("tcp", addr)
	}()
	wg.Wait()
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, n.name, err)
	}
	return ln
}

// proc is a long-running process in the namespace.
type nsProc struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	out strings.Builder
}

func (p *nsProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *nsProc) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (n *netns) start(t *testing.T, env []string, name string, args ...string) *nsProc {
	t.Helper()
	p := &nsProc{}
	p.cmd = n.cmd(context.Background(), name, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.String())
		}
	})
	return p
}

func buildBins(t *testing.T, repo string) string {
	t.Helper()
	dir := t.TempDir()
	for _, b := range []struct{ out, pkg, tags string }{
		{"bcgw", "./cmd/bcgw", ""}, {"bcd-site", "./roles/site", "fakehw"},
	} {
		args := []string{"build", "-trimpath", "-o", filepath.Join(dir, b.out)}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		c := exec.Command("go", append(args, b.pkg)...)
		c.Dir, c.Env = repo, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return dir
}

// TestPXEBoot: inside a network namespace made by the test, a DHCP server
// that only hands out addresses (dnsmasq, no PXE options), bcgw, bcd site
// with its boot server on the bridge, and QEMU (TCG, its own iPXE ROM)
// PXE-booting a diskless VM: the VM gets its boot entry from our proxy
// DHCP, its script over HTTP, the ramdisk's kernel and initramfs from the
// site's verified cache, and prints the bc.* parameters it was given.
func TestPXEBoot(t *testing.T) {
	qemu, image := prerequisites(t)
	if os.Geteuid() != 0 {
		need(t, "root (network namespaces)", fmt.Errorf("not root"))
	}
	_, err := exec.LookPath("dnsmasq")
	need(t, "dnsmasq (apt-get install dnsmasq-base)", err)
	for _, rom := range []string{"pxe-e1000.rom", "efi-e1000e.rom"} {
		if _, err := os.Stat("/usr/lib/ipxe/qemu/" + rom); err != nil {
			need(t, "QEMU's iPXE ROMs (apt-get install ipxe-qemu)", err)
		}
	}
	repo := repoRoot(t)
	bin := buildBins(t, repo)
	ns := newNetns(t)
	root := t.TempDir()

	// DHCP for addresses only; router advertisements so iPXE does not wait
	// for IPv6.
	ns.start(t, nil, "dnsmasq", "--no-daemon", "--port=0", "--interface=br0", "--bind-interfaces", "--user=root",
		"--dhcp-range=10.77.0.100,10.77.0.150,12h", "--no-ping", "--enable-ra", "--dhcp-range=::,constructor:br0,ra-only",
		"--dhcp-leasefile="+filepath.Join(root, "leases"), "--pid-file="+filepath.Join(root, "dnsmasq.pid"))

	// The image source, served over https on the bridge with a certificate
	// of the test's own CA. The site trusts it (BCD_FAKEHW_EXTRA_CA), and
	// so does the ramdisk: its initrd gets that CA as its CA bundle in an
	// appended cpio, where the real image has the build host's bundle.
	kernel, _ := os.ReadFile(filepath.Join(image, "vmlinuz"))
	initrdImage, _ := os.ReadFile(filepath.Join(image, "initramfs.cpio.zst"))
	srcCert, srcCAPEM := selfSignedTLS(t, pxeBridgeIP)
	initrd := appendCPIO(t, initrdImage, []cpio.Record{cpio.StaticFile("etc/ssl/certs/ca-certificates.crt", string(srcCAPEM), 0o644)})
	// The test installed OS (images/osimage): an MBR, an ext4 partition
	// with the kernel and an initramfs whose init runs bcd join --node-id
	// and bcd node. A second copy with one byte changed, recompressed,
	// stands in for a cache that serves bytes that are not their digest.
	osZstBytes, err := os.ReadFile(filepath.Join(image, "os.img.zst"))
	need(t, "images/out/os.img.zst (make image)", err)
	osZst := bytes.NewBuffer(osZstBytes)
	dec, _ := zstd.NewReader(nil)
	osRaw, err := dec.DecodeAll(osZstBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(osRaw)
	bad[len(bad)/2] ^= 0xff
	var badZst bytes.Buffer
	zw, _ := zstd.NewWriter(&badZst)
	zw.Write(bad)
	zw.Close()
	const provisionedID = "pxe-node-1"
	src := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/vmlinuz":
			w.Write(kernel)
		case "/initrd":
			w.Write(initrd)
		case "/os.img.zst":
			w.Write(osZst.Bytes())
		default:
			http.NotFound(w, r)
		}
	}))
	src.Listener = ns.listen(t, pxeBridgeIP+":0")
	src.TLS = &tls.Config{Certificates: []tls.Certificate{srcCert}}
	src.StartTLS()
	defer src.Close()
	ca := filepath.Join(root, "src-ca.pem")
	os.WriteFile(ca, srcCAPEM, 0o644)

	gwDir := filepath.Join(root, "gw")
	gw := ns.start(t, nil, filepath.Join(bin, "bcgw"), "serve", "--data-dir", gwDir, "--listen", pxeBridgeIP+":8443",
		"--lease-ttl", "4s", "--heartbeat", "1s")
	waitFor(t, "bcgw", 30*time.Second, func() bool { return strings.Contains(gw.String(), `"msg":"bcgw serving"`) })
	bcgw := func(args ...string) string {
		out, err := exec.Command(filepath.Join(bin, "bcgw"), append(args, "--data-dir", gwDir)...).CombinedOutput()
		if err != nil {
			t.Fatalf("bcgw %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// bcgwFail runs a bcgw command that is meant to fail.
	bcgwFail := func(args ...string) string {
		out, err := exec.Command(filepath.Join(bin, "bcgw"), append(args, "--data-dir", gwDir)...).CombinedOutput()
		if err == nil {
			t.Fatalf("bcgw %v succeeded:\n%s", args, out)
		}
		return string(out)
	}
	tok := strings.TrimSpace(bcgw("token", "create", "--role", "site", "--site", "pxe"))
	pins := strings.Fields(bcgw("well-known", "--pins"))
	siteDir := filepath.Join(root, "site")
	cfg := filepath.Join(siteDir, "config.toml")
	join := ns.cmd(context.Background(), filepath.Join(bin, "bcd-site"), append([]string{"join", "--role", "site", "--config", cfg,
		"--data-dir", filepath.Join(siteDir, "data"), "--server", "https://" + pxeBridgeIP + ":8443"}, pins...)...)
	join.Stdin = strings.NewReader(tok + "\n")
	if out, err := join.CombinedOutput(); err != nil {
		t.Fatalf("bcd join: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(cfg)
	b = regexp.MustCompile(`(?m)^socket_path = .*$`).ReplaceAll(b, []byte(fmt.Sprintf("socket_path = %q", filepath.Join(siteDir, "run", "bcd.sock"))))
	b = append(b, []byte(fmt.Sprintf("\n[boot]\nlisten = \"%s:8080\"\nurl = \"http://%s:8080\"\nserver_ip = %q\nproxy_dhcp = true\ninterface = \"br0\"\n", pxeBridgeIP, pxeBridgeIP, pxeBridgeIP))...)
	os.WriteFile(cfg, b, 0o600)
	site := ns.start(t, []string{"BCD_FAKEHW_EXTRA_CA=" + ca}, filepath.Join(bin, "bcd-site"), "site", "--config", cfg)
	var siteID string
	waitFor(t, "the site holding the boot lease", 60*time.Second, func() bool {
		var nodes []struct {
			ID        string
			Connected bool
			BootLease bool `json:"boot_lease"`
		}
		json.Unmarshal([]byte(bcgw("nodes", "--json")), &nodes)
		for _, n := range nodes {
			if n.Connected && n.BootLease {
				siteID = n.ID
				return true
			}
		}
		return false
	})
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	body := fmt.Sprintf(`{"mac":%q,"kernel":{"sha256":%q,"url":%q},"initrd":{"sha256":%q,"url":%q}}`,
		pxeMAC, sum(kernel), src.URL+"/vmlinuz", sum(initrd), src.URL+"/initrd")
	out := bcgw("run", siteID, "boot.prepareRamdisk", "--body", body, "--wait", "--timeout", "120s")
	if !strings.Contains(out, `"SUCCEEDED"`) {
		t.Fatalf("boot.prepareRamdisk: %s", out)
	}

	// The VM: diskless, its NIC's iPXE ROM boots from the network.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Four disks with partition-table signatures at both ends: virtio
	// (the installed OS boots from it), NVMe, SATA on the machine's AHCI
	// controller, and one behind an LSI MegaRAID SAS controller. The
	// machine's NIC is an e1000e. The ramdisk finds them by the drivers
	// their devices ask for.
	vda, nvme := sparseDisk(t, "vda.img", 128<<20), sparseDisk(t, "nvme.img", 64<<20)
	sata, raid := sparseDisk(t, "sata.img", 48<<20), sparseDisk(t, "raid.img", 112<<20)
	for _, d := range []string{vda, nvme, sata, raid} {
		f, _ := os.OpenFile(d, os.O_RDWR, 0)
		st, _ := f.Stat()
		f.WriteAt([]byte("EFI PART"), 512)
		f.WriteAt([]byte("EFI PART"), st.Size()-512)
		f.WriteAt([]byte{0x55, 0xaa}, 510)
		f.Close()
	}
	vm := ns.cmd(ctx, qemu, "-machine", "q35", "-accel", accel(t), "-cpu", "max", "-smp", "1", "-m", "512",
		"-nographic", "-no-reboot", "-boot", "n",
		"-drive", "file="+vda+",if=virtio,format=raw",
		"-drive", "file="+nvme+",if=none,id=nvm0,format=raw", "-device", "nvme,serial=bcdpxe0,drive=nvm0",
		"-drive", "file="+sata+",if=none,id=sata0,format=raw", "-device", "ide-hd,drive=sata0,bus=ide.0,serial=bcdsata0",
		"-device", "megasas,id=raid",
		"-drive", "file="+raid+",if=none,id=raid0,format=raw", "-device", "scsi-hd,drive=raid0,bus=raid.0,serial=bcdraid0",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", "e1000e,netdev=n0,mac="+pxeMAC)
	stdout, _ := vm.StdoutPipe()
	vm.Stderr = vm.Stdout
	start := time.Now()
	if err := vm.Start(); err != nil {
		t.Fatal(err)
	}
	// The console is read in the background (a reader that stops would
	// stall the guest's serial port).
	var cmu sync.Mutex
	var console strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			cmu.Lock()
			console.WriteString(strings.TrimRight(sc.Text(), "\r") + "\n")
			cmu.Unlock()
		}
	}()
	consoleText := func() string { cmu.Lock(); defer cmu.Unlock(); return console.String() }
	until := func(d time.Duration, cond func(string) bool) time.Duration {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			if cond(consoleText()) {
				return time.Since(start)
			}
			time.Sleep(100 * time.Millisecond)
		}
		return 0
	}
	tInit := until(90*time.Second, func(c string) bool { return strings.Contains(c, "bcd-ramdisk: init started") })
	// After the bc.* words the init says it starts the agent.
	tParams := until(90*time.Second, func(c string) bool {
		i := strings.Index(c, "boot parameters:")
		return i >= 0 && strings.Contains(c[i:], " ramdisk (")
	})
	// The ramdisk joins bcgw with the site's discovery assertion.
	tJoined := until(90*time.Second, func(c string) bool { return strings.Contains(c, `"msg":"joined"`) })
	var tKexec, tOSJoined time.Duration
	// The disks behind the AHCI and MegaRAID controllers, as the init
	// names them with the driver of the controller they sit behind.
	var sataDev, raidDev string
	if tJoined != 0 {
		blk := ""
		for _, l := range strings.Split(consoleText(), "\n") {
			if i := strings.Index(l, "bcd-ramdisk: block devices: "); i >= 0 {
				blk = l[i:]
			}
		}
		if m := regexp.MustCompile(`(sd[a-z]+) \(48 MiB\) \[ahci@`).FindStringSubmatch(blk); m != nil {
			sataDev = "/dev/" + m[1]
		}
		if m := regexp.MustCompile(`(sd[a-z]+) \(112 MiB\) \[megaraid_sas@`).FindStringSubmatch(blk); m != nil {
			raidDev = "/dev/" + m[1]
		}
		if sataDev == "" || raidDev == "" {
			t.Logf("serial console:\n%s", consoleText())
			t.Fatalf("the init did not find the AHCI and MegaRAID disks: %s", blk)
		}
		for _, d := range []string{"e1000e", "ahci", "megaraid_sas", "virtio_pci", "virtio_blk", "nvme"} {
			if !strings.Contains(consoleText(), "bcd-ramdisk: driver "+d+" for ") {
				t.Errorf("the init did not name the driver %s it loaded", d)
			}
		}
		if !strings.Contains(consoleText(), "eth0 (e1000e)") {
			t.Errorf("the e1000e NIC is not eth0 with its driver")
		}
		t.Logf("SATA disk %s, MegaRAID disk %s", sataDev, raidDev)
	}
	// The joined ramdisk answers a command, then the VM goes.
	if tJoined != 0 {
		var nodes []struct {
			ID, Role, Hostname string
			Connected          bool
		}
		waitFor(t, "the ramdisk connected", 60*time.Second, func() bool {
			json.Unmarshal([]byte(bcgw("nodes", "--json")), &nodes)
			for _, n := range nodes {
				if n.Role == "ramdisk" && n.Connected {
					if want := "pxe-" + strings.ReplaceAll(pxeMAC, ":", ""); n.Hostname != want {
						t.Errorf("the ramdisk's hostname is %q, want %q (named by its boot MAC)", n.Hostname, want)
					}
					return true
				}
			}
			return false
		})
		for _, n := range nodes {
			if n.Role != "ramdisk" {
				continue
			}
			if out := bcgw("run", n.ID, "agent.ping", "--wait", "--timeout", "60s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("agent.ping on the ramdisk: %s", out)
			}
			// disk.wipe quick on both disks, then deploy.image from the
			// site's cache onto the virtio disk.
			if out := bcgw("run", n.ID, "disk.wipe", "--body", `{"devices":["/dev/vda","/dev/nvme0n1","`+sataDev+`","`+raidDev+`"],"mode":"quick"}`, "--wait", "--timeout", "120s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("disk.wipe: %s", out)
			}
			osSum := sha256.Sum256(osZst.Bytes())
			osDigest := hex.EncodeToString(osSum[:])
			bcgw("cache-images", siteID, "--image", osDigest+"="+src.URL+"/os.img.zst")
			waitFor(t, "the OS image in the site's cache", 60*time.Second, func() bool {
				var st struct {
					Report struct {
						Images []struct{ Digest, State string }
					}
				}
				json.Unmarshal([]byte(bcgw("status", siteID, "--json")), &st)
				for _, im := range st.Report.Images {
					if im.Digest == osDigest && im.State == "READY" {
						return true
					}
				}
				return false
			})
			// The image onto the disk behind the MegaRAID controller.
			tRaid := time.Now()
			if out := bcgw("run", n.ID, "deploy.image", "--body", `{"target":"`+raidDev+`","sha256":"`+osDigest+`"}`, "--wait", "--timeout", "180s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("deploy.image onto the MegaRAID disk %s: %s", raidDev, out)
			}
			t.Logf("deploy.image onto the MegaRAID disk %s: %v", raidDev, time.Since(tRaid).Round(10*time.Millisecond))
			// QEMU's emulated SATA and SAS disks offer no secure erase (no
			// ATA Security feature set, no SANITIZE): disk.wipe secure-erase
			// refuses each, naming what it tried, and changes nothing (the
			// MegaRAID disk still holds the image at the end).
			// QEMU's IDE disk has no Security feature set; its MegaRAID
			// emulation answers SANITIZE with a hardware error.
			for dev, want := range map[string]string{sataDev: "the drive has no ATA Security feature set", raidDev: "SANITIZE BLOCK ERASE"} {
				out := bcgwFail("run", n.ID, "disk.wipe", "--body", `{"devices":["`+dev+`"],"mode":"secure-erase"}`, "--wait", "--timeout", "120s")
				if !strings.Contains(out, `"FAILED"`) || !strings.Contains(out, want) {
					t.Errorf("disk.wipe secure-erase of %s: %s", dev, out)
				}
				t.Logf("disk.wipe secure-erase of %s refused: %s", dev, firstLine(out, `"error"`))
			}
			// The cache's copy goes bad (one byte of the image changed): the
			// deploy writes it all, finds the digest wrong, fails, and
			// leaves the disk unbootable.
			blob := findBlob(t, siteDir, osDigest)
			os.WriteFile(blob, badZst.Bytes(), 0o444)
			out := bcgwFail("run", n.ID, "deploy.image", "--body", `{"target":"/dev/vda","sha256":"`+osDigest+`"}`, "--wait", "--timeout", "180s")
			if !strings.Contains(out, `"FAILED"`) || !strings.Contains(out, "unbootable") {
				t.Fatalf("deploy.image of bytes that are not their digest: %s", out)
			}
			if vb, _ := os.ReadFile(vda); !allZero(vb[:1<<20]) {
				t.Fatal("after a failed deploy.image the disk's first MiB (its partition table) is not zero")
			}
			t.Logf("deploy.image of a corrupted cache copy: FAILED, first MiB zeroed")
			os.WriteFile(blob, osZst.Bytes(), 0o444)
			// A digest the cache does not hold: the ramdisk fetches the
			// source URL over https (its CA bundle), writes the image, finds
			// another digest, fails and leaves the disk unbootable.
			wrong := sum([]byte("not the image"))
			out = bcgwFail("run", n.ID, "deploy.image", "--body", `{"target":"/dev/vda","sha256":"`+wrong+`","url":"`+src.URL+`/os.img.zst"}`, "--wait", "--timeout", "180s")
			if !strings.Contains(out, `"FAILED"`) || !strings.Contains(out, "sha256 is "+osDigest) || !strings.Contains(out, "unbootable") || !strings.Contains(out, src.URL) {
				t.Fatalf("deploy.image with a wrong digest from its https source: %s", out)
			}
			if vb, _ := os.ReadFile(vda); !allZero(vb[:1<<20]) {
				t.Fatal("after deploy.image with a wrong digest the disk's first MiB (its partition table) is not zero")
			}
			t.Logf("deploy.image with a wrong digest, from its https source URL: FAILED, first MiB zeroed")

			// The real deploy, which configures the installed OS: config.toml,
			// join-encryption.jwk, a provisioned token for pxe-node-1, and
			// NoCloud user data given to bcgw as a secret of the command.
			ud := filepath.Join(root, "user-data")
			os.WriteFile(ud, []byte("#cloud-config\nhostname: pxe-node-1\n"), 0o600)
			tDeploy := time.Now()
			body := `{"target":"/dev/vda","sha256":"` + osDigest + `","os":{"partition":1,"node_id":"` + provisionedID + `","user_data":"nocloud"}}`
			if out := bcgw("run", n.ID, "deploy.image", "--body", body, "--user-data", ud, "--wait", "--timeout", "180s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("deploy.image: %s", out)
			}
			t.Logf("deploy.image of %d bytes (zstd %d) from the site's cache, OS configured: %v", len(osRaw), osZst.Len(), time.Since(tDeploy).Round(10*time.Millisecond))
			// boot.kexec into the installed OS's own kernel, read from its
			// partition: the result comes back first, then the machine boots
			// it, and its bcd joins as the provisioned node.
			kexecBody := `{"disk":"/dev/vda","partition":1,"kernel":"boot/vmlinuz","initrd":"boot/initramfs.cpio.zst","cmdline":"console=ttyS0 panic=-1 bcos.root=/dev/vda1"}`
			if out := bcgw("run", n.ID, "boot.kexec", "--body", kexecBody, "--wait", "--timeout", "120s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("boot.kexec: %s", out)
			}
			tKexec = until(90*time.Second, func(c string) bool { return strings.Contains(c, "bcd-os: init started") })
			if tKexec == 0 {
				t.Logf("serial console:\n%s", consoleText())
				t.Fatal("the machine did not boot the installed OS's kernel")
			}
			end := time.Now().Add(150 * time.Second)
			for tOSJoined == 0 && time.Now().Before(end) {
				var nodes []struct {
					ID, Role, Hostname string
					Connected          bool
				}
				json.Unmarshal([]byte(bcgw("nodes", "--json")), &nodes)
				for _, x := range nodes {
					if x.ID == provisionedID && x.Role == "node" && x.Connected {
						tOSJoined = time.Since(start)
						if x.Hostname != provisionedID {
							t.Errorf("the installed OS's hostname is %q, want %q (its init names it after its node id)", x.Hostname, provisionedID)
						}
					}
				}
				time.Sleep(500 * time.Millisecond)
			}
			if tOSJoined == 0 {
				t.Logf("serial console:\n%s", consoleText())
				t.Fatalf("the installed OS did not join as %s", provisionedID)
			}
			t.Logf("bcgw nodes:\n%s", bcgw("nodes"))
			if out := bcgw("run", provisionedID, "agent.ping", "--wait", "--timeout", "60s"); !strings.Contains(out, `"SUCCEEDED"`) {
				t.Fatalf("agent.ping on the installed OS: %s", out)
			}
		}
	}
	cancel()
	_ = vm.Wait()
	c := consoleText()
	if tJoined != 0 {
		nb, _ := os.ReadFile(nvme)
		if !allZero(nb[:1<<20]) || !allZero(nb[len(nb)-1<<20:]) {
			t.Fatal("the NVMe disk still has data in its first or last MiB after disk.wipe quick")
		}
		vb, _ := os.ReadFile(vda)
		if !bytes.Equal(vb[:1<<20], osRaw[:1<<20]) || !allZero(vb[len(vb)-1<<20:]) {
			t.Fatal("the virtio disk does not start with the deployed image's partition table (or its last MiB was not wiped)")
		}
		checkInstalledOS(t, vb, provisionedID)
		sb, _ := os.ReadFile(sata)
		if !allZero(sb[:1<<20]) || !allZero(sb[len(sb)-1<<20:]) {
			t.Fatal("the SATA disk still has data in its first or last MiB after disk.wipe quick")
		}
		rb, _ := os.ReadFile(raid)
		if !bytes.Equal(rb[:len(osRaw)], osRaw) || !allZero(rb[len(rb)-1<<20:]) {
			t.Fatal("the MegaRAID disk does not hold the deployed image (or its last MiB was not wiped)")
		}
	}
	if tJoined == 0 {
		t.Logf("serial console:\n%s", c)
		t.Fatalf("the ramdisk did not join bcgw")
	}
	if !strings.Contains(c, "bc.mac="+pxeMAC) || !strings.Contains(c, "bc.site=pxe") {
		t.Logf("serial console:\n%s", c)
		t.Logf("site:\n%s", site.String())
		t.Fatalf("the VM did not print its bc.* parameters (QEMU ran %v)", time.Since(start))
	}
	// Read the words back and check them with bootparams.Parse (the init
	// prints bc.token's length only, so a stand-in takes its place).
	var words []string
	printed := c
	if i := strings.Index(c, "boot parameters:"); i >= 0 {
		printed = c[i:] // what the init printed, not iPXE's or the kernel's echo
	}
	for _, w := range regexp.MustCompile(`bc\.[a-z_]+=\S+`).FindAllString(printed, -1) {
		if strings.HasPrefix(w, "bc.token=") {
			w = "bc.token=bcjt_jtstandin_" + strings.Repeat("x", 32)
		}
		if !strings.HasPrefix(w, "bc.test=") && !slices.Contains(words, w) {
			words = append(words, w)
		}
	}
	p, err := bootparams.Parse(strings.Join(words, " "))
	if err != nil {
		t.Fatalf("the printed bc.* parameters do not parse: %v\n%s", err, strings.Join(words, "\n"))
	}
	if p.MAC.String() != pxeMAC || p.Site != "pxe" || !strings.HasPrefix(p.CacheURL, "http://"+pxeBridgeIP+":8080/cache/t/") || p.Gateway != "https://"+pxeBridgeIP+":8443" {
		t.Fatalf("parameters %+v\nwords:\n%s", p, strings.Join(words, "\n"))
	}
	if !strings.Contains(site.String(), `"msg":"iPXE script served"`) {
		t.Fatalf("the site did not serve the script")
	}
	// An unknown MAC gets no boot offer from us: the site notes it as
	// discovered, serves it no script, and the VM boots nothing.
	unknown := "52:54:00:77:00:99"
	ctx2, cancel2 := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel2()
	vm2 := ns.cmd(ctx2, qemu, "-machine", "q35", "-accel", accel(t), "-cpu", "max", "-smp", "1", "-m", "256",
		"-nographic", "-no-reboot", "-boot", "n",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", "e1000,netdev=n0,mac="+unknown)
	var out2 bytes.Buffer
	vm2.Stdout, vm2.Stderr = &out2, &out2
	_ = vm2.Run() // ends by the timeout: nothing boots
	if strings.Contains(out2.String(), "Linux version") {
		t.Fatalf("an unknown MAC booted a kernel:\n%s", out2.String())
	}
	if !strings.Contains(site.String(), `"mac":"`+unknown+`"`) || strings.Count(site.String(), `"msg":"iPXE script served"`) != 1 {
		t.Fatalf("the site did not note the unknown MAC, or served it a script:\n%s", site.String())
	}
	// bcgw discovered lists it, with the architecture its PXE ROM gave.
	waitFor(t, "bcgw discovered to list the unknown MAC", 30*time.Second, func() bool {
		var list []struct{ MAC, Arch string }
		json.Unmarshal([]byte(bcgw("discovered", siteID, "--json")), &list)
		return slices.ContainsFunc(list, func(d struct{ MAC, Arch string }) bool { return d.MAC == unknown && d.Arch == "bios" })
	})
	// Without the boot lease the site answers no machine, not even a
	// prepared one: the gateway goes away, the lease lapses.
	_ = gw.cmd.Process.Kill()
	time.Sleep(6 * time.Second)
	ctx3, cancel3 := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel3()
	vm3 := ns.cmd(ctx3, qemu, "-machine", "q35", "-accel", accel(t), "-cpu", "max", "-smp", "1", "-m", "256",
		"-nographic", "-no-reboot", "-boot", "n",
		"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no", "-device", "e1000,netdev=n0,mac="+pxeMAC)
	var out3 bytes.Buffer
	vm3.Stdout, vm3.Stderr = &out3, &out3
	_ = vm3.Run()
	if strings.Contains(out3.String(), "Linux version") || strings.Count(site.String(), `"msg":"iPXE script served"`) != 1 {
		t.Fatalf("a machine booted while the site did not hold the lease:\n%s", out3.String())
	}
	t.Logf("PXE: QEMU start -> ramdisk init %v -> bc.* printed %v -> joined bcgw as a ramdisk %v -> installed OS's init (kexec) %v -> joined as node %s %v; initramfs %d bytes", tInit.Round(100*time.Millisecond), tParams.Round(100*time.Millisecond), tJoined.Round(100*time.Millisecond), tKexec.Round(100*time.Millisecond), provisionedID, tOSJoined.Round(100*time.Millisecond), len(initrdImage))
}

// firstLine is the first line of s holding sub, or "".
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// findBlob finds the site cache's file of an image.
func findBlob(t *testing.T, dir, digest string) string {
	t.Helper()
	var found string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == digest && filepath.Base(filepath.Dir(p)) == "blobs" {
			found = p
		}
		return nil
	})
	if found == "" {
		t.Fatalf("no cached blob %s under %s", digest, dir)
	}
	return found
}

// checkInstalledOS reads the installed OS's file system from the disk's
// bytes with debugfs: deploy.image wrote its configuration, and its bcd
// joined (the identity is there, the one-use token file is gone).
func checkInstalledOS(t *testing.T, disk []byte, nodeID string) {
	t.Helper()
	if _, err := exec.LookPath("debugfs"); err != nil {
		need(t, "debugfs (apt-get install e2fsprogs)", err)
	}
	fsImg := filepath.Join(t.TempDir(), "fs.img")
	os.WriteFile(fsImg, disk[osimage.PartitionStart:], 0o600)
	// The VM was stopped, not shut down: what the OS wrote last may be in
	// the ext4 journal only. e2fsck replays it (debugfs does not).
	if out, err := exec.Command("e2fsck", "-fy", fsImg).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() > 1 {
			t.Fatalf("e2fsck of the installed OS's file system: %v\n%s", err, out)
		}
	}
	cat := func(p string) string {
		b, _ := exec.Command("debugfs", "-R", "cat "+p, fsImg).Output()
		return string(b)
	}
	for p, want := range map[string]string{
		"/etc/bcd/config.toml": "gateway = \"https://" + pxeBridgeIP + ":8443\"", "/etc/bcd/node-id": nodeID,
		"/etc/bcd/join-encryption.jwk": `"kty":"EC"`, "/var/lib/cloud/seed/nocloud/user-data": "hostname: pxe-node-1",
		"/var/lib/bcd/identity.json": nodeID,
	} {
		if got := cat(p); !strings.Contains(got, want) {
			t.Errorf("%s on the installed OS's disk: %q, want it to contain %q", p, got, want)
		}
	}
	if b, _ := exec.Command("debugfs", "-R", "stat /etc/bcd/join-token", fsImg).CombinedOutput(); !strings.Contains(string(b), "File not found") {
		t.Errorf("the provisioned token is still on the disk after the join:\n%s", b)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, d)
}

// selfSignedTLS makes a CA certificate for ip that serves TLS itself, and
// its PEM.
func selfSignedTLS(t *testing.T, ip string) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bcd PXE test image source"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.ParseIP(ip)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
