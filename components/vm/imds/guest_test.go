package imds

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/vm/domainxml"
	"github.com/better-compute/bcd/components/vm/guestimage"
	"github.com/better-compute/bcd/components/vm/libvirttest"
	"github.com/better-compute/bcd/components/vm/seed"
)

// guestUserData is the real guest's cloud-init user data: it takes its
// NIC's address, asks the metadata service for a session token and an
// identity token, then asks again as if forwarding for another address,
// and prints each answer on the serial console.
const guestUserData = `#cloud-config
runcmd:
  - |
    ip link set eth0 up
    ip addr add 10.9.0.5/24 dev eth0
    url=http://10.9.0.1:8080/latest
    T=$(curl -sS --retry 10 --retry-connrefused --retry-delay 1 -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 60" $url/api/token)
    echo "bcd-imds-token-length ${#T}" > /dev/ttyS0
    echo "bcd-imds-identity $(curl -sS -H "X-aws-ec2-metadata-token: $T" "$url/identity-token?audience=sts.example.com")" > /dev/ttyS0
    echo "bcd-imds-forwarded $(curl -s -o /dev/null -w '%{http_code}' -H "X-aws-ec2-metadata-token: $T" -H "X-Forwarded-For: 10.9.0.6" "$url/identity-token?audience=sts.example.com")" > /dev/ttyS0
`

// TestFromRealGuest: a real Debian guest (guestimage) on a real libvirtd
// running in the test's network namespace, its NIC a tap named by
// TapName on the bridge there, under the policy the helper would load.
// cloud-init's runcmd, from the seed, curls the metadata service: it gets
// a session token and an identity token for its audience naming vm-a,
// and a request saying it was forwarded for another address is refused.
func TestFromRealGuest(t *testing.T) {
	img := guestimage.Cached(t)
	qemuImg := testenv.NeedTool(t, "qemu-img", "qemu-utils")
	host := netpolicytest.New(t)
	host.Bridge("br0", "10.9.0.1/24")
	serve(t, host, `{"instances":[{"id":"vm-a","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24"],"policy":"PRIVATE"}]}]}`)
	d := libvirttest.StartWith(t, libvirttest.Options{NetNS: host.Name})

	instances := t.TempDir()
	dir := filepath.Join(instances, "vm-a")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", "-b", img.Path, "-F", "qcow2", filepath.Join(dir, "disk.qcow2")).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	if err := seed.WriteFile(filepath.Join(dir, "seed.iso"), seed.Seed{InstanceID: "vm-a", UserData: []byte(guestUserData)}); err != nil {
		t.Fatal(err)
	}
	xml, err := domainxml.Render(domainxml.Request{
		ID: "vm-a", VCPUs: 1, MemoryMiB: 512, Accel: libvirttest.Accel(),
		Disks: []domainxml.Disk{{Name: "disk.qcow2", Format: "qcow2", Boot: 1}, {Name: "seed.iso", Format: "raw", CDROM: true}},
		Taps:  []domainxml.Tap{{Name: netpolicy.TapName("vm-a", 0), Bridge: "br0", MAC: "52:54:00:0a:00:01"}},
	}, domainxml.Host{InstancesDir: instances, Bridges: []string{"br0"}, AllowTCG: libvirttest.Accel() == domainxml.TCG})
	if err != nil {
		t.Fatal(err)
	}
	def := filepath.Join(t.TempDir(), "vm-a.xml")
	if err := os.WriteFile(def, xml, 0o600); err != nil {
		t.Fatal(err)
	}
	console := d.ReadConsole(t, "vm-a")
	for _, args := range [][]string{{"define", def}, {"start", "vm-a"}} {
		if out, err := d.Virsh(t, args...); err != nil {
			t.Fatalf("%v: %s\n%s", err, out, d.Log())
		}
	}
	wait := 10 * time.Minute // the boot, then the answers come within seconds of each other
	for _, want := range []string{
		"bcd-imds-token-length 43", // 32 random bytes, base64 without padding
		"bcd-imds-identity jwt-for:vm-a:sts.example.com",
		"bcd-imds-forwarded 403",
	} {
		if !console.Wait(want, wait) {
			t.Fatalf("no %q on the guest's console within %s; the console:\n%s", want, wait, console.String())
		}
		wait = time.Minute
	}
	t.Logf("the guest's answers on its console %s after its start", time.Since(console.Opened()).Round(time.Second))
}
