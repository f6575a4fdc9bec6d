package doctor

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/anchor"
	"github.com/better-compute/bcd/components/trust/pki/es256"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// TestHelperTrust: a signed record for this node is ok; none warns (trust
// on first use); a record for another node, or one signed by a key that is
// not the pin, fails.
func TestHelperTrust(t *testing.T) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	spki, _ := es256.MarshalSPKI(k.Public())
	dir := t.TempDir()
	cfg := &config.Config{DataDir: filepath.Join(dir, "data"), JoinSigningKeyPin: rootsig.Pin(spki),
		Helper: config.Helper{Socket: "/run/x/h.sock", User: "bcd", StateDir: filepath.Join(dir, "state")}}
	os.MkdirAll(cfg.DataDir, 0o700)
	os.WriteFile(filepath.Join(cfg.DataDir, "identity.json"), []byte(`{"node_id":"node_a"}`), 0o600)
	run := func() Result { return HelperTrust(cfg).Run(context.Background()) }
	if r := run(); r.Status != Warn || !strings.Contains(r.Detail, "first signed section") {
		t.Errorf("no record: %+v", r)
	}
	write := func(node string) {
		res := append([]byte{0x0a, byte(len(node))}, node...)
		sig, _ := es256.Sign(k, rootsig.PurposeJoinResponse, res)
		if err := anchor.WriteRecord(cfg.Helper.StateDir, rootsig.JoinRecord{V: 1, NodeID: node, Result: res, Signature: sig, SigningKey: spki}); err != nil {
			t.Fatal(err)
		}
	}
	write("node_a")
	if r := run(); r.Status != OK || !strings.Contains(r.Detail, "node_a") {
		t.Errorf("a record for this node: %+v", r)
	}
	write("node_b")
	if r := run(); r.Status != Fail || !strings.Contains(r.Detail, "is for node node_b, but this node is node_a") {
		t.Errorf("a record for another node: %+v", r)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ospki, _ := es256.MarshalSPKI(other.Public())
	cfg.JoinSigningKeyPin = rootsig.Pin(ospki)
	if r := run(); r.Status != Fail || !strings.Contains(r.Detail, "join_signing_key_pin") {
		t.Errorf("a record under another pin: %+v", r)
	}
}
