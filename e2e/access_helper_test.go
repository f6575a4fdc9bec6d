package e2e

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/anchor"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/pki/es256"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// TestAccessThroughHelper: an unprivileged bcd node applies its access
// section through the real bcd helper (root): the helper renders sshd's
// files under its file table root (a helpere2e build's
// BCD_HELPER_E2E_ROOT), has Debian's sshd -t accept them and reloads the
// test's sshd, and a certificate from bcgw ssh-sign logs in; a principal
// for root is refused by the helper and fails the section.
func TestAccessThroughHelper(t *testing.T) {
	testenv.NeedRoot(t, "it creates users, runs bcd helper and sshd as root")
	testenv.NeedTool(t, "sshd", "openssh-server")
	l := newLab(t)
	base := sshdtest.Root(t)
	if err := os.Mkdir(filepath.Join(base, "hroot"), 0o755); err != nil {
		t.Fatal(err)
	}

	// sshd reads the files the helper writes under hroot.
	hroot := filepath.Join(base, "hroot")
	port := sshdtest.FreePort(t)
	sshdtest.Config(t, hroot, port)
	sshdtest.Start(t, hroot, port)
	acct := sshdtest.Account(t)

	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	hn := newHelperNode(t, l, g, base, "bcd-node", "fakehw helpere2e", "")
	root, asUser, cfg, state, id, uid := hn.root, hn.asUser, hn.cfg, hn.state, hn.id, hn.uid
	helper := root.startEnv([]string{"BCD_HELPER_E2E_ROOT=" + hroot}, "bcd-helper", "helper", "--config", cfg)
	helper.waitLog(t, "helper: listening", 10*time.Second)
	asUser.startEnv([]string{"BCD_FAKEHW_ACCESS_ROOT=" + hroot}, "bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	l.bcgw(g, "ssh-ca", id, "--account", acct)
	keys := filepath.Join(base, "keys")
	os.Mkdir(keys, 0o700)
	key := sshdtest.UserKey(t, keys, "user")
	l.bcgw(g, "ssh-sign", "--principal", id+":"+acct, "--pubkey", key+".pub")
	login := func() error {
		a := sshdtest.SSHArgs(key, key+"-cert.pub", "-p", strconv.Itoa(port), acct+"@127.0.0.1", "id -un")
		out, err := exec.Command("ssh", a...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != acct {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	eventually(t, "login with sshd's files from the helper", login)
	if _, err := os.Stat(filepath.Join(hroot, "etc/ssh/sshd_config.d/10-better-compute.conf")); err != nil {
		t.Fatalf("the drop-in: %v", err)
	}
	st := l.waitStatus(g, id, "the access section converged", func(s adminapi.StatusView) bool {
		for _, x := range s.Sections {
			if x.Name == "access" && x.State == "CONVERGED" {
				return true
			}
		}
		return false
	})
	_ = st
	applied := 0
	for _, o := range helperOps(t, helper.stderr.String()) {
		if o["op"] == "access.apply" && o["outcome"] == "ok" && o["uid"] == float64(uid) {
			applied++
		}
	}
	if applied == 0 {
		t.Fatalf("no access.apply from the node in the helper's log:\n%s", helper.stderr.String())
	}

	// The node account, broken into, asks root for its own user CA and
	// a principal it chose, unsigned and then signed by a key of its own:
	// the helper refuses both, and a certificate from that CA does not
	// log in (it did when the helper took the section on the node's word).
	sock := filepath.Join(base, "run", "helper.sock")
	ownCA := filepath.Join(keys, "own-ca")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "own@node", "-f", ownCA).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	caPub, _ := os.ReadFile(ownCA + ".pub")
	section := fmt.Sprintf(`{"ssh":{"user_ca":%q,"principals":{%q:["pwned"]}}}`, strings.TrimSpace(string(caPub)), acct)
	for _, by := range []string{"", "own key"} {
		req := ownAccessRequest(t, id, section, by != "")
		code, out, _ := asUser.run(req, nil, "bcd-helper", "helper-call", "--socket", sock, "--raw")
		if !strings.Contains(out, `"ok":false`) || !strings.Contains(out, "refused") {
			t.Fatalf("an own CA (signed by %q) through the helper: exit %d %s", by, code, out)
		}
	}
	if out, err := exec.Command("ssh-keygen", "-q", "-s", ownCA, "-I", "pwn", "-n", "pwned", key+".pub").CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen -s: %v: %s", err, out)
	}
	if out, err := exec.Command("ssh", sshdtest.SSHArgs(key, key+"-cert.pub", "-p", strconv.Itoa(port), acct+"@127.0.0.1", "id -un")...).CombinedOutput(); err == nil {
		t.Fatalf("a certificate from the node's own CA logged in: %s", out)
	}
	l.bcgw(g, "ssh-sign", "--principal", id+":"+acct, "--pubkey", key+".pub")
	if err := login(); err != nil {
		t.Fatalf("login with the operator's certificate after the refusals: %v", err)
	}

	// A new command-signing root, added by bcgw trust (a new bundle
	// version): a spec signed outside bcgw by that root alone is applied
	// through the helper, which takes the newer bundle the node forwards
	// with no restart.
	rootKey := l.keyFile("new-root.key")
	kb, _ := os.ReadFile(rootKey)
	rk, err := pki.ParsePrivateKeyPEM(kb)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(rk.Public())
	rootPub := filepath.Join(l.root, "new-root.pub")
	os.WriteFile(rootPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	heldBefore := heldBundleVersion(t, state)
	l.bcgw(g, "trust", "add-root", "--key", rootPub)
	// A full spec (a submitted patch is re-signed by bcgw when the spec
	// is next sent in full; a submitted full spec keeps its signature).
	var got struct {
		Spec map[string]map[string]map[string]any `json:"spec"`
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "spec", "get", id)), &got); err != nil || got.Spec["access"]["ssh"] == nil {
		t.Fatalf("bcgw spec get: %v %v", err, got)
	}
	full := got.Spec
	full["access"]["ssh"]["principals"] = map[string]any{acct: []string{id + ":" + acct, "rotated"}}
	var ps prepared
	if err := json.Unmarshal([]byte(l.bcgw(g, "spec", "prepare", id, "--file", l.writeJSON("rotated.json", full))), &ps); err != nil {
		t.Fatal(err)
	}
	l.bcgw(g, "spec", "submit", l.writeJSON("rotated-signed.json", l.sign(ps, rootKey)))
	eventually(t, "the principal the new root signed", func() error {
		b, err := os.ReadFile(filepath.Join(hroot, "etc/ssh/bc_principals", acct))
		if err != nil || !strings.Contains(string(b), "rotated") {
			return fmt.Errorf("principals %q: %v", b, err)
		}
		return nil
	})
	if after := heldBundleVersion(t, state); after <= heldBefore {
		t.Errorf("the helper holds trust bundle version %d after the rotation, %d before", after, heldBefore)
	}
	if err := helper.cmd.Process.Signal(syscall.Signal(0)); err != nil || strings.Count(helper.stderr.String(), "helper: listening") != 1 {
		t.Fatalf("the helper did not run on through the rotation: %v", err)
	}

	// A principal for root: the helper refuses, the section fails, and
	// the files stay as they were.
	l.bcgw(g, "ssh-ca", id, "--account", "root")
	l.waitStatus(g, id, "the access section failed on root", func(s adminapi.StatusView) bool {
		for _, x := range s.Sections {
			if x.Name == "access" && x.State == "FAILED" && strings.Contains(x.Message, "root") {
				return true
			}
		}
		return false
	})
	if _, err := os.Stat(filepath.Join(hroot, "etc/ssh/bc_principals/root")); !os.IsNotExist(err) {
		t.Fatalf("a principals file for root: %v", err)
	}
	if err := login(); err != nil {
		t.Fatalf("login after the refused change: %v", err)
	}
}

// ownAccessRequest is an access.apply the node account could forge: the
// section with a proof for node id at a generation far ahead, unsigned or
// signed by a key of its own.
func ownAccessRequest(t *testing.T, node, section string, sign bool) string {
	t.Helper()
	d, err := rootsig.SectionDigests(map[string]json.RawMessage{"access": json.RawMessage(section)})
	if err != nil {
		t.Fatal(err)
	}
	p := rootsig.Proof{NodeID: node, Generation: 1 << 40, SpecSHA256: make([]byte, 32), Sections: d}
	if sign {
		k, _ := pki.GenerateKey()
		spki, _ := es256.MarshalSPKI(k.Public())
		sig, err := es256.Sign(k, rootsig.PurposeDesiredState, p.Message())
		if err != nil {
			t.Fatal(err)
		}
		id := rootsig.KeyID(spki)
		p.Signature, p.Signer = append(id[:], sig...), spki
	}
	pj, _ := json.Marshal(p)
	return fmt.Sprintf(`{"v":1,"op":"access.apply","section":%q,"proof":%s}`, base64.StdEncoding.EncodeToString([]byte(section)), pj)
}

// heldBundleVersion is the version of the trust bundle root's helper holds
// in its state directory (0: none).
func heldBundleVersion(t *testing.T, state string) uint64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, anchor.BundleFile))
	if os.IsNotExist(err) {
		return 0
	}
	var tb rootsig.Bundle
	if err != nil || json.Unmarshal(b, &tb) != nil {
		t.Fatalf("%s: %v", anchor.BundleFile, err)
	}
	var d struct {
		Version uint64 `json:"version"`
	}
	json.Unmarshal(tb.Document, &d)
	return d.Version
}
