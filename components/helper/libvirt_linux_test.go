//go:build linux

package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/helper/wire"

	"github.com/better-compute/bcd/components/trust/rootsig"
)

// recordingLibvirt stands in for the instances' root half
// (components/vm/rootvirt, tested on a real libvirtd there): it records
// what the helper hands it.
type recordingLibvirt struct {
	calls []string
	host  LibvirtHost
	// console opens what Console hands back (nil: a final refusal).
	console func() (*os.File, error)
}

func (r *recordingLibvirt) Console(_ context.Context, h LibvirtHost, id string) (*os.File, bool, error) {
	r.calls, r.host = append(r.calls, "console "+id), h
	if r.console == nil {
		return nil, true, errors.New("no such domain: " + id)
	}
	f, err := r.console()
	return f, false, err
}

func (r *recordingLibvirt) Define(_ context.Context, h LibvirtHost, id string, section []byte) (bool, error) {
	r.calls, r.host = append(r.calls, "define "+id+" "+string(section)), h
	return false, nil
}

func (r *recordingLibvirt) Restore(_ context.Context, h LibvirtHost, id string, section []byte) (bool, error) {
	r.calls, r.host = append(r.calls, "restore "+id+" "+string(section)), h
	return false, nil
}

func (r *recordingLibvirt) Act(_ context.Context, h LibvirtHost, op, id string) (bool, error) {
	r.calls, r.host = append(r.calls, op+" "+id), h
	return false, nil
}

func libvirtServer(t *testing.T) (*opServer, *recordingLibvirt, *intentSigner) {
	o := newOpServer(t, nil)
	lv := &recordingLibvirt{}
	o.srv.cfg.Libvirt = lv
	o.srv.cfg.Update.DataDir = "/var/lib/bcd"
	o.srv.uid = 4242
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	return o, lv, sig
}

// defineRequest is libvirt.define of id with section and its proof.
func defineRequest(t *testing.T, id, section string, p rootsig.Proof) string {
	t.Helper()
	pj, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"v":1,"op":"libvirt.define","id":%q,"section":%q,"proof":%s}`, id, base64.StdEncoding.EncodeToString([]byte(section)), pj)
}

const instancesSection = `{"images":[],"instances":[{"id":"vm-a","vcpus":1}]}`

func TestLibvirtDefine(t *testing.T) {
	o, lv, sig := libvirtServer(t)
	wantOK(t, o.call(t, defineRequest(t, "vm-a", instancesSection, sig.proof(t, map[string]string{"instances": instancesSection}, sig.root))))
	wantOK(t, o.call(t, `{"v":1,"op":"libvirt.start","id":"vm-a"}`))
	if want := []string{"define vm-a " + instancesSection, "libvirt.start vm-a"}; strings.Join(lv.calls, "|") != strings.Join(want, "|") {
		t.Fatalf("calls %q, want %q", lv.calls, want)
	}
	// Root's own word: the node's data_dir and uid, the node its join
	// record binds it to (the domains' owner), kvm unless root's
	// [instances] accel says otherwise.
	if lv.host.DataDir != "/var/lib/bcd" || lv.host.Owner != 4242 || lv.host.Accel != "kvm" || lv.host.Node != "node_a" {
		t.Errorf("host %+v", lv.host)
	}
	o.srv.cfg.Instances.Accel = "qemu"
	wantOK(t, o.call(t, `{"v":1,"op":"libvirt.destroy","id":"vm-a"}`))
	if lv.host.Accel != "qemu" {
		t.Errorf("accel %q with root's [instances] accel = qemu", lv.host.Accel)
	}
}

// TestLibvirtOnlySigned: root defines a domain only from a signed
// instances section, and no request carries domain XML.
func TestLibvirtOnlySigned(t *testing.T) {
	o, lv, sig := libvirtServer(t)
	evil := `{"images":[],"instances":[{"id":"vm-a","vcpus":512,"memory_mib":16777216}]}`
	own := newKey(t)
	xml := base64.StdEncoding.EncodeToString([]byte(`<domain><qemu:commandline/></domain>`))
	for _, tt := range []struct {
		name, want string
		req        func() string
	}{
		{"unsigned", "UNSIGNED", func() string {
			return defineRequest(t, "vm-a", evil, sig.proof(t, map[string]string{"instances": evil}, nil))
		}},
		{"signed by the node's own key", "BAD_SIGNATURE", func() string {
			return defineRequest(t, "vm-a", evil, sig.proof(t, map[string]string{"instances": evil}, own))
		}},
		{"another section with a signed spec", "differs from the one the spec's signature covers", func() string {
			return defineRequest(t, "vm-a", evil, sig.proof(t, map[string]string{"instances": instancesSection}, sig.root))
		}},
		{"the access section's proof", "has no instances section", func() string {
			return defineRequest(t, "vm-a", evil, sig.proof(t, map[string]string{"access": evil}, sig.root))
		}},
		{"no proof", "no proof", func() string {
			return `{"v":1,"op":"libvirt.define","id":"vm-a","section":"` + base64.StdEncoding.EncodeToString([]byte(evil)) + `"}`
		}},
		{"domain XML as data", "takes no data", func() string {
			return `{"v":1,"op":"libvirt.define","id":"vm-a","data":"` + xml + `"}`
		}},
		{"domain XML in a field of its own", "unknown field", func() string {
			return `{"v":1,"op":"libvirt.define","id":"vm-a","xml":"` + xml + `"}`
		}},
		{"an operation that takes XML", "unknown operation", func() string {
			return `{"v":1,"op":"libvirt.define_xml","data":"` + xml + `"}`
		}},
		{"a path as the id", "id must name an instance", func() string {
			return `{"v":1,"op":"libvirt.start","id":"../../etc"}`
		}},
		{"a section with start", "takes no section", func() string {
			return `{"v":1,"op":"libvirt.start","id":"vm-a","section":"e30="}`
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := o.call(t, tt.req())
			if r.OK || r.Retryable || !strings.Contains(r.Error, tt.want) {
				t.Fatalf("answer %+v, want a refusal containing %q", r, tt.want)
			}
			if len(lv.calls) != 0 {
				t.Fatalf("the refused request reached libvirt: %q", lv.calls)
			}
		})
	}
}

func TestLibvirtNone(t *testing.T) {
	o, _, _ := libvirtServer(t)
	o.srv.cfg.Libvirt = nil
	r := o.call(t, `{"v":1,"op":"libvirt.start","id":"vm-a"}`)
	if r.OK || r.Retryable || !strings.Contains(r.Error, "runs no instances") {
		t.Fatalf("answer %+v", r)
	}
}

func TestGPUAddresses(t *testing.T) {
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.smi = func(context.Context, ...string) ([]byte, error) {
			return []byte("GPU-5f1c0a2b-0000-4000-8000-0123456789ab, 00000000:3B:00.0\n\n"), nil
		}
	})
	g, err := o.srv.gpuAddresses(context.Background())
	if err != nil || g["GPU-5f1c0a2b-0000-4000-8000-0123456789ab"] != "00000000:3B:00.0" || len(g) != 1 {
		t.Fatalf("gpuAddresses = %v, %v", g, err)
	}
	o.srv.s.smi = func(context.Context, ...string) ([]byte, error) { return []byte("GPU-x, 0000:01:00.0\n"), nil }
	if _, err := o.srv.gpuAddresses(context.Background()); err == nil {
		t.Fatal("a bad UUID passed")
	}
}

// TestLibvirtConsolePassesDescriptor: libvirt.console, over the helper's
// real socket, hands the node the very terminal the instances' root half
// opened (SCM_RIGHTS): bytes written on the pty's other side are read
// from the descriptor the client got, and bytes written to it arrive
// there; the helper keeps no copy. A refusal carries none, and
// libvirt.console takes nothing but an id.
func TestLibvirtConsolePassesDescriptor(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	must(t, unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts := "/dev/pts/" + strconv.Itoa(n)
	// Raw, so bytes pass as they are.
	tio, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	tio.Lflag &^= unix.ECHO | unix.ICANON | unix.ISIG | unix.IEXTEN
	tio.Oflag &^= unix.OPOST
	tio.Iflag &^= unix.ICRNL
	must(t, unix.IoctlSetTermios(int(ptmx.Fd()), unix.TCSETS, tio))
	lv := &recordingLibvirt{}
	var opened *os.File
	h := startHelper(t, func(c *Config, s *seams) {
		c.Libvirt = lv
		c.Update.DataDir = "/var/lib/bcd"
	})
	lv.console = func() (*os.File, error) {
		var err error
		opened, err = os.OpenFile(pts, os.O_RDWR|unix.O_NOCTTY, 0)
		return opened, err
	}
	resp, err := h.client.Do(context.Background(), &wire.Request{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "vm-a"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Console || resp.File == nil {
		t.Fatalf("answer %+v carries no console", resp)
	}
	got := resp.File
	defer got.Close()
	// The helper closed its copy once sent.
	if _, err := opened.Stat(); err == nil {
		t.Error("the helper still holds the console it passed")
	}
	if _, err := ptmx.Write([]byte("from the guest")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	got.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err := got.Read(buf)
	if err != nil || string(buf[:k]) != "from the guest" {
		t.Fatalf("read %q, %v from the passed console", buf[:k], err)
	}
	if _, err := got.Write([]byte("typed")); err != nil {
		t.Fatal(err)
	}
	ptmx.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, err = ptmx.Read(buf)
	if err != nil || string(buf[:k]) != "typed" {
		t.Fatalf("the pty's other side read %q, %v", buf[:k], err)
	}

	lv.console = nil
	if _, err := h.client.Do(context.Background(), &wire.Request{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "vm-b"}); err == nil || !strings.Contains(err.Error(), "no such domain") {
		t.Fatalf("a refused console: %v", err)
	}
	for _, req := range []*wire.Request{
		{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "../../dev/pts/0"},
		{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "vm-a", Data: []byte("/dev/pts/0")},
		{V: wire.Version, Op: wire.OpLibvirtConsole, ID: "vm-a", Kind: "tty"},
	} {
		if err := req.Check(); err == nil {
			t.Errorf("libvirt.console %+v passes Check", req)
		}
	}
	if want := "console vm-a|console vm-b"; strings.Join(lv.calls, "|") != want {
		t.Fatalf("calls %q, want %q", lv.calls, want)
	}
}
