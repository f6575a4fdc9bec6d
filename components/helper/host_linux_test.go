//go:build linux

package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/host/unit"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// fakeUnits runs the real units (components/host/unit, as roles/helper
// composes them) on a fake host, so the test changes no kernel.
type fakeUnits struct {
	reg  *unit.Registry
	host *unit.Fake
}

func (f fakeUnits) Has(name string) bool { return f.reg.Get(name) != nil }

func (f fakeUnits) Apply(ctx context.Context, _, name string, section []byte) ([]string, bool, error) {
	c, err := f.reg.ApplyOne(ctx, f.host, name, section)
	return c, unit.Final(err), err
}

func hostServer(t *testing.T) (*opServer, *unit.Fake, *intentSigner) {
	o := newOpServer(t, nil)
	h := unit.NewFake()
	h.SetFile("/proc/sys/kernel/msgmax", "8192\n")
	o.srv.cfg.HostUnits = fakeUnits{reg: unit.Standard(), host: h}
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	return o, h, sig
}

// hostRequest is host.unit of name with section and its proof.
func hostRequest(t *testing.T, name, section string, p rootsig.Proof) string {
	t.Helper()
	pj, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	sec := ""
	if section != "" {
		sec = `"section":"` + base64.StdEncoding.EncodeToString([]byte(section)) + `",`
	}
	return fmt.Sprintf(`{"v":1,"op":"host.unit","id":%q,%s"proof":%s}`, name, sec, pj)
}

const hostSysctl = `{"sysctl":{"settings":{"kernel.msgmax":"16384"}}}`

func TestHostUnit(t *testing.T) {
	o, h, sig := hostServer(t)
	wantOK(t, o.call(t, hostRequest(t, "sysctl", hostSysctl, sig.proof(t, map[string]string{"host": hostSysctl}, sig.root))))
	if v, _ := h.File("/proc/sys/kernel/msgmax"); v != "16384" {
		t.Fatalf("msgmax %q after host.unit", v)
	}
	if f, _ := h.File(unit.SysctlFile); !strings.Contains(f, "kernel.msgmax = 16384") {
		t.Fatalf("%s = %q", unit.SysctlFile, f)
	}
	// The same generation again, for another unit: admitted (each unit
	// of a pass is its own call); nothing to do for it.
	p := sig.proof(t, map[string]string{"host": hostSysctl}, sig.root)
	wantOK(t, o.call(t, hostRequest(t, "sysctl", hostSysctl, p)))
	wantOK(t, o.call(t, hostRequest(t, "hugepages", hostSysctl, p)))
}

// TestHostUnitOnlySigned: root applies a unit only from a signed spec,
// whatever the node sends.
func TestHostUnitOnlySigned(t *testing.T) {
	o, h, sig := hostServer(t)
	evil := `{"sysctl":{"settings":{"kernel.msgmax":"1024"}}}`
	own := newKey(t)
	for _, tt := range []struct {
		name, want string
		req        func() string
	}{
		{"unsigned", "UNSIGNED", func() string {
			return hostRequest(t, "sysctl", evil, sig.proof(t, map[string]string{"host": evil}, nil))
		}},
		{"signed by the node's own key", "BAD_SIGNATURE", func() string {
			return hostRequest(t, "sysctl", evil, sig.proof(t, map[string]string{"host": evil}, own))
		}},
		{"another section with a signed spec", "differs from the one the spec's signature covers", func() string {
			return hostRequest(t, "sysctl", evil, sig.proof(t, map[string]string{"host": hostSysctl}, sig.root))
		}},
		{"no proof", "no proof", func() string {
			return `{"v":1,"op":"host.unit","id":"sysctl","section":"` + base64.StdEncoding.EncodeToString([]byte(evil)) + `"}`
		}},
		{"a unit the helper lacks", "not a host unit", func() string {
			return hostRequest(t, "nvidia-rootkit", evil, sig.proof(t, map[string]string{"host": evil}, sig.root))
		}},
		{"a path as the unit", "id must name a host unit", func() string {
			return hostRequest(t, "../sysctl", evil, sig.proof(t, map[string]string{"host": evil}, sig.root))
		}},
		{"signed settings a unit refuses", "invalid", func() string {
			bad := `{"sysctl":{"settings":{"kernel.msgmax":"1\nkernel.x = 2"}}}`
			return hostRequest(t, "sysctl", bad, sig.proof(t, map[string]string{"host": bad}, sig.root))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := o.call(t, tt.req())
			if r.OK || r.Retryable || !strings.Contains(r.Error, tt.want) {
				t.Fatalf("answer %+v, want a refusal containing %q", r, tt.want)
			}
			if v, _ := h.File("/proc/sys/kernel/msgmax"); v != "8192\n" {
				t.Fatalf("msgmax %q: the refused request changed the host", v)
			}
			if _, ok := h.File(unit.SysctlFile); ok {
				t.Fatal("the refused request wrote the sysctl file")
			}
			if c := h.Calls(); len(c) != 0 {
				t.Fatalf("the refused request ran %v", c)
			}
		})
	}
}

// TestHostUnitOff: root's own [host] units = false refuses every
// host.unit, signed or not.
func TestHostUnitOff(t *testing.T) {
	o, h, sig := hostServer(t)
	o.srv.cfg.HostOff = true
	r := o.call(t, hostRequest(t, "sysctl", hostSysctl, sig.proof(t, map[string]string{"host": hostSysctl}, sig.root)))
	if r.OK || r.Retryable || !strings.Contains(r.Error, "[host] units = false") {
		t.Fatalf("answer %+v, want the refusal naming [host] units", r)
	}
	if v, _ := h.File("/proc/sys/kernel/msgmax"); v != "8192\n" {
		t.Fatalf("msgmax %q", v)
	}
}
