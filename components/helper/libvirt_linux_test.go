//go:build linux

package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/trust/rootsig"
)

// recordingLibvirt stands in for the instances' root half
// (components/vm/rootvirt, tested on a real libvirtd there): it records
// what the helper hands it.
type recordingLibvirt struct {
	calls []string
	host  LibvirtHost
}

func (r *recordingLibvirt) Define(_ context.Context, h LibvirtHost, id string, section []byte) (bool, error) {
	r.calls, r.host = append(r.calls, "define "+id+" "+string(section)), h
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
	// Root's own word: the node's data_dir and uid, kvm unless root's
	// [instances] accel says otherwise.
	if lv.host.DataDir != "/var/lib/bcd" || lv.host.Owner != 4242 || lv.host.Accel != "kvm" {
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
