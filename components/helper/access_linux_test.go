//go:build linux

package helper

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/anchor"
	"github.com/better-compute/bcd/components/trust/pki/es256"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

const testCA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1UrUbkA/HMG5PYPTtjNljV18Cf8t9kA4v5lsmfZuu2 ca@bcgw"

// accessServer is an opServer whose accounts are alice (1000) and root,
// and whose sshd -t answers what *sshdErr holds.
func accessServer(t *testing.T) (*opServer, *error) {
	testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	var sshdErr error
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.sshAccount = func(name string) (int, error) {
			switch name {
			case "alice":
				return 1000, nil
			case "root":
				return 0, nil
			}
			return 0, errors.New("unknown user " + name)
		}
		s.sshdTest = func(context.Context) error { return sshdErr }
	})
	return o, &sshdErr
}

func TestAccessApply(t *testing.T) {
	o, sshdErr := accessServer(t)
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	accessReq := func(ssh string) string { return sig.signedAccess(t, ssh) }
	good := accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["node-1:alice"]},"revoked_serials":[4]}`)
	wantOK(t, o.call(t, good))
	dropin, err := os.ReadFile(filepath.Join(o.root, "etc/ssh/sshd_config.d/10-better-compute.conf"))
	if err != nil || !strings.Contains(string(dropin), "\nTrustedUserCAKeys "+o.root+"/etc/ssh/bc_ca.pub\n") {
		t.Fatalf("drop-in %q, %v", dropin, err)
	}
	assertFile(t, filepath.Join(o.root, "etc/ssh/bc_principals/alice"), []byte("node-1:alice\n"), 0o644)
	assertFile(t, filepath.Join(o.root, "etc/ssh/bc_ca.pub"), []byte(strings.TrimSuffix(testCA, " ca@bcgw")+"\n"), 0o644)

	// Refusals change nothing on disk.
	before := snapshot(t, o.root, o.root)
	for name, req := range map[string]string{
		"newline in the CA":         accessReq(`{"user_ca":"` + testCA + `\nPermitRootLogin yes"}`),
		"keyword in the CA":         accessReq(`{"user_ca":"` + strings.Replace(testCA, "ca@bcgw", "ForceCommand", 1) + `"}`),
		"newline in a principal":    accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["a\nMatch all"]}}`),
		"keyword as a principal":    accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["PermitRootLogin"]}}`),
		"principal for root":        accessReq(`{"user_ca":"` + testCA + `","principals":{"root":["node-1:root"]}}`),
		"an unknown account":        accessReq(`{"user_ca":"` + testCA + `","principals":{"mallory":["x"]}}`),
		"drop-in text":              accessReq(`{"user_ca":"` + testCA + `","dropin":"PermitRootLogin yes"}`),
		"a field in another case":   accessReq(`{"User_CA":"` + testCA + `"}`),
		"access that is not object": accessReq(`"x"`),
	} {
		t.Run(name, func(t *testing.T) {
			r := o.call(t, req)
			if r.OK || r.Retryable {
				t.Fatalf("answer %+v, want a refusal", r)
			}
			sameSnapshot(t, before, snapshot(t, o.root, o.root))
		})
	}

	// sshd -t refusing puts the previous files back.
	*sshdErr = errors.New("sshd -t = exit status 255: line 3: Bad configuration option")
	r := o.call(t, accessReq(`{"user_ca":"`+testCA+`","principals":{"alice":["other"]},"revoked_serials":[4,5]}`))
	wantFailed(t, r, "sshd -t rejected", false)
	sameSnapshot(t, before, snapshot(t, o.root, o.root))

	// An empty section removes every file.
	*sshdErr = nil
	wantOK(t, o.call(t, accessReq(`{}`)))
	for _, p := range []string{"etc/ssh/sshd_config.d/10-better-compute.conf", "etc/ssh/bc_ca.pub", "etc/ssh/bc_krl", "etc/ssh/bc_principals/alice"} {
		if _, err := os.Lstat(filepath.Join(o.root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}

// TestAccessApplyOnlySigned: the node account cannot make root install
// its own CA, empty the KRL or replay an older spec: access.apply takes a
// section only with the signature of a spec, for this node, by a
// command-signing root of a trust bundle root's pinned join-signing key
// signed. Each refusal leaves sshd's files as they were.
func TestAccessApplyOnlySigned(t *testing.T) {
	o, _ := accessServer(t)
	sig := newIntentSigner(t, "node_a")
	state := o.anchoredBy(sig)
	operator := `{"user_ca":"` + testCA + `","principals":{"alice":["node-1:alice"]},"revoked_serials":[4,9]}`
	wantOK(t, o.call(t, sig.signedAccess(t, operator)))
	wantOK(t, o.call(t, sig.signedAccess(t, operator))) // generation 2
	krl, _ := os.ReadFile(filepath.Join(o.root, "etc/ssh/bc_krl"))
	if len(krl) == 0 {
		t.Fatal("no KRL written")
	}
	own := newKey(t)
	ownCA := `{"user_ca":"` + testCA[:len(testCA)-8] + `own@node","principals":{"alice":["sudoer"]}}`
	ownSection := `{"ssh":` + ownCA + `}`
	noKRL := `{"ssh":{"user_ca":"` + testCA + `","principals":{"alice":["node-1:alice"]}}}`
	before := snapshot(t, o.root, o.root)
	otherJoin := newKey(t)
	for _, tt := range []struct {
		name, want string
		req        func() string
	}{
		{"unsigned own CA", "UNSIGNED", func() string {
			return accessRequest(t, ownSection, sig.proof(t, map[string]string{"access": ownSection}, nil))
		}},
		{"own CA signed by the node's own key", "BAD_SIGNATURE", func() string {
			return accessRequest(t, ownSection, sig.proof(t, map[string]string{"access": ownSection}, own))
		}},
		{"own CA under a bundle the node signed itself", "join_signing_key_pin", func() string {
			p := sig.proof(t, map[string]string{"access": ownSection}, own)
			b := sig.signBundle(t, otherJoin, 7, own)
			p.Bundle = &b
			return accessRequest(t, ownSection, p)
		}},
		{"own CA sent with the operator's signed spec", "differs from the one the spec's signature covers", func() string {
			return accessRequest(t, ownSection, sig.proof(t, map[string]string{"access": `{"ssh":` + operator + `}`}, sig.root))
		}},
		{"the KRL emptied", "differs from the one the spec's signature covers", func() string {
			return accessRequest(t, noKRL, sig.proof(t, map[string]string{"access": `{"ssh":` + operator + `}`}, sig.root))
		}},
		{"the section dropped from a signed spec", "carries none", func() string {
			return accessRequest(t, "", sig.proof(t, map[string]string{"access": `{"ssh":` + operator + `}`}, sig.root))
		}},
		{"a signed spec for another node", "root is bound to node node_a", func() string {
			other := *sig
			other.node = "node_b"
			return accessRequest(t, noKRL, other.proof(t, map[string]string{"access": noKRL}, sig.root))
		}},
		{"an older signed spec", "an older spec is refused", func() string {
			old := *sig
			old.gen = 0
			return accessRequest(t, noKRL, old.proof(t, map[string]string{"access": noKRL}, sig.root))
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := o.call(t, tt.req())
			if r.OK || r.Retryable || !strings.Contains(r.Error, tt.want) {
				t.Fatalf("answer %+v, want a refusal containing %q", r, tt.want)
			}
			sameSnapshot(t, before, snapshot(t, o.root, o.root))
		})
	}

	// A rotated bundle (a new root, version 2) is taken without a restart;
	// the old root's signatures are then refused.
	next := newKey(t)
	b2 := sig.signBundle(t, sig.join, 2, next)
	sig.bundle = &b2
	oldRoot := sig.root
	sig.root = next
	wantOK(t, o.call(t, sig.signedAccess(t, operator)))
	sig.root = oldRoot
	if r := o.call(t, sig.signedAccess(t, operator)); r.OK || !strings.Contains(r.Error, "BAD_SIGNATURE") {
		t.Errorf("the old root after rotation: %+v", r)
	}
	sig.root = next
	// A bundle that names no roots once root holds some is refused.
	b3 := sig.signBundle(t, sig.join, 3)
	sig.bundle = &b3
	if r := o.call(t, sig.signedAccess(t, operator)); r.OK || !strings.Contains(r.Error, "names no command-signing roots") {
		t.Errorf("a bundle without roots: %+v", r)
	}
	sig.bundle = &b2
	wantOK(t, o.call(t, sig.signedAccess(t, operator)))

	// Bound on first use (no join record): the first node is kept.
	if b, err := os.ReadFile(filepath.Join(state, "tofu-node.json")); err != nil || !strings.Contains(string(b), "node_a") {
		t.Errorf("tofu-node.json %q, %v", b, err)
	}
}

// TestAccessApplyWithoutRoots: with no trust bundle naming roots, and no
// pinned roots, the helper refuses with the fix.
func TestAccessApplyWithoutRoots(t *testing.T) {
	o, _ := accessServer(t)
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	sig.bundle = nil
	r := o.call(t, sig.signedAccess(t, `{}`))
	if r.OK || !strings.Contains(r.Error, "root holds no command-signing roots") || !strings.Contains(r.Error, "command_root_sha256") {
		t.Fatalf("no bundle: %+v", r)
	}
	b := sig.signBundle(t, sig.join, 1)
	sig.bundle = &b
	if r := o.call(t, sig.signedAccess(t, `{}`)); r.OK || !strings.Contains(r.Error, "root holds no command-signing roots") {
		t.Fatalf("a bundle without roots: %+v", r)
	}
}

// TestAccessApplyPinnedRoots: [helper] command_root_sha256 pins the only
// roots: a spec signed by a root of the bundle that is not pinned is
// refused; one signed by the pinned key passes, without any bundle.
func TestAccessApplyPinnedRoots(t *testing.T) {
	o, _ := accessServer(t)
	sig := newIntentSigner(t, "node_a")
	o.anchoredBy(sig)
	pinned := newKey(t)
	id := rootsig.KeyID(spkiOf(t, pinned))
	o.srv.cfg.CommandRoots = []string{hex.EncodeToString(id[:])}
	if r := o.call(t, sig.signedAccess(t, `{}`)); r.OK || !strings.Contains(r.Error, "root holds no command-signing roots") {
		t.Fatalf("a bundle root that is not pinned: %+v", r)
	}
	sig.bundle = nil
	p := sig.proof(t, map[string]string{"access": `{"ssh":{}}`}, pinned)
	p.Signer = spkiOf(t, pinned)
	wantOK(t, o.call(t, accessRequest(t, `{"ssh":{}}`, p)))
}

// TestAccessApplyJoinRecord: a join record binds root to its node; one
// that does not verify under root's pin refuses everything, saying so.
func TestAccessApplyJoinRecord(t *testing.T) {
	o, _ := accessServer(t)
	sig := newIntentSigner(t, "node_a")
	state := o.anchoredBy(sig)
	result := append([]byte{0x0a, byte(len("node_b"))}, "node_b"...)
	rs, _ := es256.Sign(sig.join, rootsig.PurposeJoinResponse, result)
	rec := rootsig.JoinRecord{V: 1, NodeID: "node_b", Result: result, Signature: rs, SigningKey: spkiOf(t, sig.join)}
	if err := anchor.WriteRecord(state, rec); err != nil {
		t.Fatal(err)
	}
	if r := o.call(t, sig.signedAccess(t, `{}`)); r.OK || !strings.Contains(r.Error, "root is bound to node node_b") {
		t.Fatalf("a spec for node_a with a record for node_b: %+v", r)
	}
	sig.node = "node_b"
	wantOK(t, o.call(t, sig.signedAccess(t, `{}`)))
	rec.NodeID = "node_c" // the signed result names node_b
	if err := anchor.WriteRecord(state, rec); err != nil {
		t.Fatal(err)
	}
	if r := o.call(t, sig.signedAccess(t, `{}`)); r.OK || !strings.Contains(r.Error, "run bcd join again as root") {
		t.Fatalf("a record that does not verify: %+v", r)
	}
}
