// Package seal carries secrets between a gateway and an agent sealed to
// the one request that asked for them.
//
// The agent makes a fresh P-256 key for each request, puts its public key
// in the request (reply_key) and signs the request with its node key for
// the purpose "bcd/secret-request/v1" over the request id, the secret's
// name, workflow and command, the node id and the SHA-256 of the reply
// key. The gateway checks that signature under the node's certificate and
// answers with a compact JWE (ECDH-ES+A256KW, A256GCM) to the reply key,
// whose plaintext names the request id and an expiry 10 s on. The agent
// opens it only with that request's key, only for that request id, only
// within 10 s of asking, and forgets the key after one answer. A secret
// therefore never crosses the session in clear, not even inside TLS, and
// an answer recorded from one request opens for no other.
// docs/signed-intent.md describes it.
package seal

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Purposes of a node's signature of a request.
const (
	PurposeRequest         = "bcd/secret-request/v1"
	PurposeWorkloadRequest = "bcd/workload-token-request/v1"
)

// Window is how long an answer opens after the request was made.
const Window = 10 * time.Second

// MaxSealed bounds a sealed answer.
const MaxSealed = 1 << 20

type requestMessage struct {
	V              int    `json:"v"`
	RequestID      string `json:"request_id"`
	Name           string `json:"name"`
	WorkflowID     string `json:"workflow_id"`
	CommandID      string `json:"command_id"`
	NodeID         string `json:"node_id"`
	ReplyKeySHA256 []byte `json:"reply_key_sha256"`
}

// RequestMessage is what a node signs of a request.
func RequestMessage(nodeID string, r *bcdv1.SecretRequest) []byte {
	sum := sha256.Sum256(r.GetReplyKey())
	b, _ := json.Marshal(requestMessage{V: 1, RequestID: r.GetRequestId(), Name: r.GetName(), WorkflowID: r.GetWorkflowId(),
		CommandID: r.GetCommandId(), NodeID: nodeID, ReplyKeySHA256: sum[:]})
	return b
}

// plaintext is what a sealed answer holds.
type plaintext struct {
	RequestID string `json:"request_id"`
	Value     []byte `json:"value"`
	ExpMS     int64  `json:"exp_unix_ms"`
}

type workloadMessage struct {
	V              int    `json:"v"`
	RequestID      string `json:"request_id"`
	Audience       string `json:"audience"`
	Instance       string `json:"instance,omitempty"`
	NodeID         string `json:"node_id"`
	ReplyKeySHA256 []byte `json:"reply_key_sha256"`
}

// WorkloadRequestMessage is what a node signs of a workload token request.
func WorkloadRequestMessage(nodeID string, r *bcdv1.WorkloadTokenRequest) []byte {
	sum := sha256.Sum256(r.GetReplyKey())
	b, _ := json.Marshal(workloadMessage{V: 1, RequestID: r.GetRequestId(), Audience: r.GetAudience(), Instance: r.GetInstance(), NodeID: nodeID, ReplyKeySHA256: sum[:]})
	return b
}

// Opener is one request's side of the exchange.
type Opener struct {
	mu       sync.Mutex
	key      *ecdsa.PrivateKey
	id       string
	deadline time.Time
}

// replyPair makes a request's reply key pair.
func replyPair() (*ecdsa.PrivateKey, []byte, error) {
	k, err := pki.GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	spki, err := x509.MarshalPKIXPublicKey(k.Public())
	return k, spki, err
}

// NewRequest makes r's reply key and node signature (r's id, name,
// workflow and command set) and returns what opens its answer.
func NewRequest(nodeKey crypto.Signer, nodeID string, r *bcdv1.SecretRequest, now time.Time) (*Opener, error) {
	k, spki, err := replyPair()
	if err != nil {
		return nil, err
	}
	r.ReplyKey = spki
	sig, err := pki.Sign(nodeKey, PurposeRequest, RequestMessage(nodeID, r))
	if err != nil {
		return nil, fmt.Errorf("signing the secret request: %w", err)
	}
	r.NodeSignature = sig
	return &Opener{key: k, id: r.GetRequestId(), deadline: now.Add(Window)}, nil
}

// NewWorkloadRequest is NewRequest for a workload token request.
func NewWorkloadRequest(nodeKey crypto.Signer, nodeID string, r *bcdv1.WorkloadTokenRequest, now time.Time) (*Opener, error) {
	k, spki, err := replyPair()
	if err != nil {
		return nil, err
	}
	r.ReplyKey = spki
	sig, err := pki.Sign(nodeKey, PurposeWorkloadRequest, WorkloadRequestMessage(nodeID, r))
	if err != nil {
		return nil, fmt.Errorf("signing the workload token request: %w", err)
	}
	r.NodeSignature = sig
	return &Opener{key: k, id: r.GetRequestId(), deadline: now.Add(Window)}, nil
}

// Open returns the secret in a sealed answer, once: the key is forgotten
// whatever the outcome.
func (o *Opener) Open(a *bcdv1.SecretAnswer, now time.Time) ([]byte, error) {
	return o.OpenSealed(a.GetSealed(), now)
}

// OpenSealed opens a sealed answer's compact JWE, once.
func (o *Opener) OpenSealed(sealed string, now time.Time) ([]byte, error) {
	o.mu.Lock()
	k := o.key
	o.key = nil
	o.mu.Unlock()
	if k == nil {
		return nil, errors.New("this request's answer was already opened")
	}
	if now.After(o.deadline) {
		return nil, fmt.Errorf("the answer came more than %s after the request; not opened", Window)
	}
	if len(sealed) == 0 || len(sealed) > MaxSealed {
		return nil, errors.New("the answer is not sealed")
	}
	jwe, err := jose.ParseEncrypted(sealed, []jose.KeyAlgorithm{jose.ECDH_ES_A256KW}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return nil, fmt.Errorf("sealed answer: %w", err)
	}
	pt, err := jwe.Decrypt(k)
	if err != nil {
		return nil, fmt.Errorf("sealed answer does not open with this request's key: %w", err)
	}
	defer clear(pt)
	var p plaintext
	if err := json.Unmarshal(pt, &p); err != nil {
		return nil, fmt.Errorf("sealed answer: %w", err)
	}
	switch {
	case p.RequestID != o.id:
		clear(p.Value)
		return nil, errors.New("the sealed answer is for another request")
	case now.UnixMilli() > p.ExpMS:
		clear(p.Value)
		return nil, errors.New("the sealed answer has expired")
	}
	return p.Value, nil
}

// VerifyRequest checks a request's node signature under the node key of
// the session it came on, and that it carries a reply key.
func VerifyRequest(nodeKey crypto.PublicKey, nodeID string, r *bcdv1.SecretRequest) error {
	if _, err := replyKey(r); err != nil {
		return err
	}
	if err := pki.Verify(nodeKey, PurposeRequest, RequestMessage(nodeID, r), r.GetNodeSignature()); err != nil {
		return fmt.Errorf("the request is not signed by the node key: %w", err)
	}
	return nil
}

// VerifyWorkloadRequest is VerifyRequest for a workload token request.
func VerifyWorkloadRequest(nodeKey crypto.PublicKey, nodeID string, r *bcdv1.WorkloadTokenRequest) error {
	if _, err := parseReplyKey(r.GetReplyKey()); err != nil {
		return err
	}
	if err := pki.Verify(nodeKey, PurposeWorkloadRequest, WorkloadRequestMessage(nodeID, r), r.GetNodeSignature()); err != nil {
		return fmt.Errorf("the request is not signed by the node key: %w", err)
	}
	return nil
}

func replyKey(r *bcdv1.SecretRequest) (*ecdsa.PublicKey, error) {
	return parseReplyKey(r.GetReplyKey())
}

func parseReplyKey(der []byte) (*ecdsa.PublicKey, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("the request has no usable reply key: %w", err)
	}
	ep, ok := pub.(*ecdsa.PublicKey)
	if !ok || ep.Curve.Params().Name != "P-256" {
		return nil, errors.New("the request's reply key is not an ECDSA P-256 key")
	}
	return ep, nil
}

// Seal answers r with value, sealed to its reply key, expiring Window
// after now.
func Seal(r *bcdv1.SecretRequest, value []byte, now time.Time) (string, error) {
	return SealTo(r.GetReplyKey(), r.GetRequestId(), value, now)
}

// SealTo seals value for request id to the reply key replyKeyDER.
func SealTo(replyKeyDER []byte, id string, value []byte, now time.Time) (string, error) {
	pub, err := parseReplyKey(replyKeyDER)
	if err != nil {
		return "", err
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: jose.ECDH_ES_A256KW, Key: pub}, nil)
	if err != nil {
		return "", err
	}
	pt, err := json.Marshal(plaintext{RequestID: id, Value: value, ExpMS: now.Add(Window).UnixMilli()})
	if err != nil {
		return "", err
	}
	defer clear(pt)
	obj, err := enc.Encrypt(pt)
	if err != nil {
		return "", err
	}
	return obj.CompactSerialize()
}
