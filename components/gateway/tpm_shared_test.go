package gateway_test

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway"
)

// A TPM join whose challenge one gateway gave is answered through the
// other (the agent's second call took another connection through the
// balancer): the answer is checked against the challenge in the database
// and admitted once; the same answer replayed through the first gateway
// is refused as already answered.
func TestTPMJoinAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	tp := newTPM(t, "")
	enrollEK(t, g1, tp)
	req, _ := tpmRequest(t, tp, tp, tp)
	resp, err := call(g1.client(t, nil), req)
	if err != nil || resp.GetChallenge() == nil {
		t.Fatalf("challenge through the first gateway: %v %v", resp, err)
	}
	ch := resp.GetChallenge()
	secret, err := tp.ActivateCredential(ch.GetCredentialBlob(), ch.GetEncryptedSecret())
	if err != nil {
		t.Fatal(err)
	}
	req.Tpm.ChallengeId, req.Tpm.ChallengeAnswer = ch.GetId(), secret
	resp, err = call(g2.client(t, nil), req)
	if err != nil || len(resp.GetResult()) == 0 {
		t.Fatalf("answer through the second gateway: %v, challenge %v; want admitted", err, resp.GetChallenge())
	}
	nodes, _ := g1.s.Store().Nodes()
	_, err = call(g1.client(t, nil), req)
	if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "already answered") {
		t.Fatalf("the answer replayed through the first gateway: %v, want already answered", err)
	}
	if after, _ := g1.s.Store().Nodes(); len(after) != len(nodes) {
		t.Error("a replayed answer added a node")
	}
	m, err := g1.s.Store().MetaPrefix("tpm/challenge/")
	rec := string(m["tpm/challenge/"+ch.GetId()])
	if err != nil || len(m) != 1 || strings.Contains(rec, hex.EncodeToString(secret)) || strings.Contains(rec, base64.StdEncoding.EncodeToString(secret)) || !strings.Contains(rec, `"used":true`) {
		t.Errorf("stored challenges %v (%v): want one, without its secret", m, err)
	}
}
