//go:build linux

package helper

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/netpolicy/netpolicytest"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// netpolicyRequest is netpolicy.apply of section with its proof.
func netpolicyRequest(t *testing.T, section string, p rootsig.Proof) string {
	t.Helper()
	pj, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`{"v":1,"op":"netpolicy.apply","section":%q,"proof":%s}`, base64.StdEncoding.EncodeToString([]byte(section)), pj)
}

// netpolicyServer is a helper whose nft and host bridges are those of a
// network namespace of the test, with bridge br0 (10.9.0.1/24).
func netpolicyServer(t *testing.T) (*opServer, *netpolicytest.NS, *intentSigner) {
	ns := netpolicytest.New(t)
	ns.Bridge("br0", "10.9.0.1/24", "fd09::1/64")
	ns.Port("", "notbr", "notbr-peer", "")
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.nft = ns.Nft
		s.netHost = func(b []string) (h netpolicy.Host, err error) {
			err = ns.Do(func() error { h, err = netpolicy.ReadHost("/sys", b); return err })
			return h, err
		}
	})
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	return o, ns, sig
}

const policySection = `{"images":[],"instances":[
 {"id":"vm-a","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0a:00:01","addresses":["10.9.0.5/24","fd09::5/64"],"policy":"PRIVATE"}]},
 {"id":"vm-b","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0b:00:01","policy":"EGRESS"}]},
 {"id":"vm-host","state":"RUNNING","nics":[{"bridge":"br0","mac":"52:54:00:0c:00:01","addresses":["10.9.0.1/24"],"policy":"EGRESS"}]},
 {"id":"vm-dummy","state":"RUNNING","nics":[{"bridge":"notbr","mac":"52:54:00:0d:00:01","policy":"EGRESS"}]}]}`

// TestNetPolicyApply: the helper loads the policy it rendered from a
// signed section: vm-a and vm-b guarded, vm-host (the host bridge's
// address) and vm-dummy (an interface that is no bridge) failed with
// their taps passing nothing; firewall.check then finds the tables
// loaded, and a flush.
func TestNetPolicyApply(t *testing.T) {
	o, ns, sig := netpolicyServer(t)
	r := o.call(t, netpolicyRequest(t, policySection, sig.proof(t, map[string]string{"instances": policySection}, sig.root)))
	wantOK(t, r)
	var ans struct{ Failed map[string]string }
	if err := json.Unmarshal(r.NetPolicy, &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Failed) != 2 || !strings.Contains(ans.Failed["vm-host"], "host bridge br0's own") || !strings.Contains(ans.Failed["vm-dummy"], "not a bridge") {
		t.Fatalf("failed %v", ans.Failed)
	}
	list, err := ns.Nft(context.Background(), nil, "list", "table", "bridge", "bcd_instances")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"vm-a", "vm-b"} {
		if !strings.Contains(string(list), "chain from_"+netpolicy.TapName(id, 0)) {
			t.Errorf("no chain for %s's tap", id)
		}
	}
	for _, id := range []string{"vm-host", "vm-dummy"} {
		if strings.Contains(string(list), netpolicy.TapName(id, 0)) {
			t.Errorf("%s's tap has rules of its own", id)
		}
	}
	if r.Rules == nil || *r.Rules < 20 {
		t.Fatalf("rules %v", r.Rules)
	}
	check := fmt.Sprintf(`{"v":1,"op":"firewall.check","rules":%d}`, *r.Rules)
	if c := o.call(t, check); !c.OK || !*c.Loaded {
		t.Fatalf("firewall.check after apply: %s", c.Error)
	}
	// libvirt.define attaches only a tap the loaded policy guards.
	ctx := context.Background()
	if err := o.srv.tapGuarded(ctx, netpolicy.TapName("vm-a", 0)); err != nil {
		t.Fatalf("vm-a's tap: %v", err)
	}
	for _, tap := range []string{netpolicy.TapName("vm-host", 0), netpolicy.TapName("vm-a", 1), "vnet0"} {
		if err := o.srv.tapGuarded(ctx, tap); err == nil || !strings.Contains(err.Error(), "not guarded") {
			t.Errorf("tap %s: %v", tap, err)
		}
	}
	ns.Run("nft", "flush", "table", "bridge", "bcd_instances")
	if err := o.srv.tapGuarded(ctx, netpolicy.TapName("vm-a", 0)); err == nil || !strings.Contains(err.Error(), "do not hold") {
		t.Errorf("vm-a's tap after a flush: %v", err)
	}
	if c := o.call(t, check); !c.OK || *c.Loaded {
		t.Fatal("firewall.check after a flush: still loaded")
	}
	// The same signed section again loads it again.
	wantOK(t, o.call(t, netpolicyRequest(t, policySection, sig.proof(t, map[string]string{"instances": policySection}, sig.root))))
	if c := o.call(t, check); !c.OK || !*c.Loaded {
		t.Fatal("firewall.check after the reload: not loaded")
	}
}

// TestNetPolicyOnlySigned: nothing loads without a signed section, and no
// request carries rules.
func TestNetPolicyOnlySigned(t *testing.T) {
	o, ns, sig := netpolicyServer(t)
	own := newKey(t)
	for _, c := range []struct{ name, req, want string }{
		{"unsigned", netpolicyRequest(t, policySection, sig.proof(t, map[string]string{"instances": policySection}, nil)), "UNSIGNED"},
		{"signed by the node's own key", netpolicyRequest(t, policySection, sig.proof(t, map[string]string{"instances": policySection}, own)), "BAD_SIGNATURE"},
		{"another section than signed", netpolicyRequest(t, policySection, sig.proof(t, map[string]string{"instances": `{"instances":[]}`}, sig.root)), "differs"},
		{"a ruleset", `{"v":1,"op":"netpolicy.apply","ruleset":"flush ruleset"}`, "ruleset"},
		{"rule text as data", `{"v":1,"op":"netpolicy.apply","data":"Zmx1c2ggcnVsZXNldA=="}`, "takes no data"},
		{"no proof", `{"v":1,"op":"netpolicy.apply","section":"e30="}`, "no proof"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := o.call(t, c.req)
			if r.OK || !strings.Contains(r.Error, c.want) {
				t.Fatalf("answer %+v, want refused with %q", r, c.want)
			}
			if _, err := ns.Nft(context.Background(), nil, "list", "table", "bridge", "bcd_instances"); err == nil {
				t.Fatal("a table was loaded")
			}
		})
	}
}
