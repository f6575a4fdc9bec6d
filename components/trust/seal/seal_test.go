package seal

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func request(t *testing.T, id string, now time.Time) (*bcdv1.SecretRequest, *Opener, interface{ Public() any }) {
	t.Helper()
	node, _ := pki.GenerateKey()
	r := &bcdv1.SecretRequest{RequestId: id, Name: "discovery-token", WorkflowId: "cmd_1", CommandId: "cmd_1"}
	o, err := NewRequest(node, "node_a", r, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyRequest(node.Public(), "node_a", r); err != nil {
		t.Fatalf("a fresh request does not verify: %v", err)
	}
	return r, o, nil
}

func TestSealedRoundTripAndRefusals(t *testing.T) {
	now := time.Now()
	secret := []byte("bcjt_secret_value_never_in_clear")
	r, o, _ := request(t, "sec-1", now)
	sealed, err := Seal(r, secret, now)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains([]byte(sealed), secret) {
		t.Fatal("the sealed answer holds the secret in clear")
	}
	got, err := o.Open(&bcdv1.SecretAnswer{RequestId: "sec-1", Sealed: sealed}, now.Add(time.Second))
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := o.Open(&bcdv1.SecretAnswer{Sealed: sealed}, now); err == nil || !strings.Contains(err.Error(), "already opened") {
		t.Errorf("opened twice: %v", err)
	}

	// An answer sealed for another request does not open with this one's
	// key; one sealed to this key but naming another request id is refused.
	_, o2, _ := request(t, "sec-2", now)
	if _, err := o2.Open(&bcdv1.SecretAnswer{Sealed: sealed}, now); err == nil {
		t.Error("another request's answer opened")
	}
	r4, o4, _ := request(t, "sec-4", now)
	r4.RequestId = "sec-5" // sealed naming another id, to sec-4's key
	s4, _ := Seal(r4, secret, now)
	if _, err := o4.Open(&bcdv1.SecretAnswer{Sealed: s4}, now); err == nil || !strings.Contains(err.Error(), "another request") {
		t.Errorf("an answer naming another request id: %v", err)
	}

	// Late: more than 10 s after the request.
	r6, o6, _ := request(t, "sec-6", now)
	s6, _ := Seal(r6, secret, now)
	if _, err := o6.Open(&bcdv1.SecretAnswer{Sealed: s6}, now.Add(Window+time.Millisecond)); err == nil || !strings.Contains(err.Error(), "more than 10s") {
		t.Errorf("a late answer: %v", err)
	}
	// Expired by the gateway's clock: sealed 11 s before it is opened.
	r7, o7, _ := request(t, "sec-7", now)
	s7, _ := Seal(r7, secret, now.Add(-11*time.Second))
	if _, err := o7.Open(&bcdv1.SecretAnswer{Sealed: s7}, now); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired answer: %v", err)
	}
}

func TestVerifyRequestRefuses(t *testing.T) {
	now := time.Now()
	node, _ := pki.GenerateKey()
	other, _ := pki.GenerateKey()
	r := &bcdv1.SecretRequest{RequestId: "sec-1", Name: "bmc-credentials", CommandId: "cmd_1"}
	if _, err := NewRequest(node, "node_a", r, now); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		pub  any
		node string
		mut  func(*bcdv1.SecretRequest)
	}{
		"another node key": {other.Public(), "node_a", nil},
		"another node id":  {node.Public(), "node_b", nil},
		"another name":     {node.Public(), "node_a", func(x *bcdv1.SecretRequest) { x.Name = "discovery-token" }},
		"another command":  {node.Public(), "node_a", func(x *bcdv1.SecretRequest) { x.CommandId = "cmd_2" }},
		"another reply key": {node.Public(), "node_a", func(x *bcdv1.SecretRequest) {
			k, _ := pki.GenerateKey()
			y := &bcdv1.SecretRequest{}
			NewRequest(k, "x", y, now)
			x.ReplyKey = y.ReplyKey
		}},
		"no reply key": {node.Public(), "node_a", func(x *bcdv1.SecretRequest) { x.ReplyKey = nil }},
	} {
		x := &bcdv1.SecretRequest{RequestId: r.RequestId, Name: r.Name, CommandId: r.CommandId, ReplyKey: r.ReplyKey, NodeSignature: r.NodeSignature}
		if tc.mut != nil {
			tc.mut(x)
		}
		if err := VerifyRequest(tc.pub, tc.node, x); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

// TestWorkloadRequestCoversInstance: the node's signature covers the
// instance a workload token is asked for, so a request cannot be replayed
// for another instance; a request for no instance signs as before.
func TestWorkloadRequestCoversInstance(t *testing.T) {
	key, _ := pki.GenerateKey()
	r := &bcdv1.WorkloadTokenRequest{RequestId: "wt-1", Audience: "sts.example", Instance: "vm-1"}
	if _, err := NewWorkloadRequest(key, "node_a", r, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := VerifyWorkloadRequest(key.Public(), "node_a", r); err != nil {
		t.Fatal(err)
	}
	r.Instance = "vm-2"
	if err := VerifyWorkloadRequest(key.Public(), "node_a", r); err == nil {
		t.Fatal("the request verified for another instance")
	}
	if strings.Contains(string(WorkloadRequestMessage("node_a", &bcdv1.WorkloadTokenRequest{RequestId: "x"})), "instance") {
		t.Fatal("a request for no instance names one in its signed message")
	}
}
