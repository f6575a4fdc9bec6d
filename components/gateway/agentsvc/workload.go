package agentsvc

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// WorkloadTokenTTL is how long a workload token is valid.
const WorkloadTokenTTL = 5 * time.Minute

// answerWorkloadToken answers a node's signed request with a JWT for the
// audience (issuer bcgw, subject the node), sealed to the request's reply
// key; nothing travels in clear.
func (s *Service) answerWorkloadToken(l *hub.Live, req *bcdv1.WorkloadTokenRequest) *bcdv1.GatewayFrame {
	ans := &bcdv1.WorkloadTokenAnswer{RequestId: req.GetRequestId()}
	err := seal.VerifyWorkloadRequest(l.NodeKey, l.NodeID, req)
	var tok string
	if err == nil && req.GetInstance() != "" {
		err = s.runsInstance(l.NodeID, req.GetInstance())
	}
	if err == nil {
		tok, err = s.workloadToken(l.NodeID, req.GetAudience(), req.GetInstance())
	}
	if err == nil {
		ans.Sealed, err = seal.SealTo(req.GetReplyKey(), req.GetRequestId(), []byte(tok), s.now())
	}
	if err != nil {
		ans.Error = err.Error()
		s.log.Warn("workload token refused", "node", l.NodeID, "instance", req.GetInstance(), "audience", req.GetAudience(), "reason", err.Error())
	} else {
		s.log.Info("workload token answered", "node", l.NodeID, "instance", req.GetInstance(), "audience", req.GetAudience())
	}
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_WorkloadTokenAnswer{WorkloadTokenAnswer: ans}}
}

// runsInstance checks that the node's desired spec names instance in
// its instances section, RUNNING: only such an instance gets a token.
func (s *Service) runsInstance(node, instance string) error {
	return s.instanceIn(node, instance, "RUNNING")
}

// instanceIn checks that the node's desired spec names instance in its
// instances section in one of states.
func (s *Service) instanceIn(node, instance string, states ...string) error {
	sp, err := s.store.Spec(node)
	if err != nil {
		return fmt.Errorf("the node's desired spec: %w", err)
	}
	var spec struct {
		Instances *struct {
			Instances []struct {
				ID    string `json:"id"`
				State string `json:"state"`
			} `json:"instances"`
		} `json:"instances"`
	}
	if len(sp.Spec) > 0 {
		if err := json.Unmarshal(sp.Spec, &spec); err != nil {
			return fmt.Errorf("the node's desired spec: %w", err)
		}
	}
	if spec.Instances != nil {
		for _, in := range spec.Instances.Instances {
			if in.ID == instance && slices.Contains(states, in.State) {
				return nil
			}
		}
	}
	return fmt.Errorf("the node's desired spec runs no instance %q", instance)
}

func (s *Service) workloadToken(node, audience, instance string) (string, error) {
	if audience == "" || len(audience) > 256 || strings.ContainsFunc(audience, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) {
		return "", errors.New("the audience must be 1 to 256 printable characters without spaces")
	}
	kid, err := pki.Pin(s.keys.Workload.Public())
	if err != nil {
		return "", err
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: s.keys.Workload},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		return "", fmt.Errorf("workload token signer: %w", err)
	}
	now := s.now()
	extra := map[string]any{}
	if instance != "" {
		extra["instance"] = instance
	}
	return jwt.Signed(signer).Claims(extra).Claims(jwt.Claims{
		Issuer: "bcgw", Subject: node, Audience: jwt.Audience{audience},
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(now.Add(WorkloadTokenTTL)),
		ID: fleet.RandomID(16),
	}).Serialize()
}
