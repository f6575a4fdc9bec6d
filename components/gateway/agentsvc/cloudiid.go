package agentsvc

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/cloudiid"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// DefaultCloudIIDMaxAge is how long after its launch (the document's
// pendingTime) an EC2 instance may join with the cloud-iid attestor.
const DefaultCloudIIDMaxAge = 24 * time.Hour

// joinCloudIID admits an EC2 instance by its identity document: the
// signature verifies under a pinned certificate, the instance launched
// within the maximum age, it never joined before, and a cloud-iid rule of
// its account (and region) for the role has a use left, which is spent.
// The node is bound to the instance and the account.
func (s *Service) joinCloudIID(m *bcdv1.JoinRequest) (*connect.Response[bcdv1.JoinResponse], error) {
	log := s.log.With("rpc", "Join", "role", m.GetRole(), "attestor", cloudiid.Attestor)
	refuse := func(format string, a ...any) error {
		err := fmt.Errorf(format, a...)
		log.Warn("join refused", "reason", err.Error())
		return connect.NewError(connect.CodePermissionDenied, err)
	}
	if r := m.GetRole(); r != "node" && r != "site" {
		return nil, connectErr(connect.CodeInvalidArgument, "role %q cannot join with attestor cloud-iid", r)
	}
	if len(s.cfg.CloudIIDCerts) == 0 {
		return nil, refuse("this gateway pins no certificates for EC2 identity documents (bcgw serve --cloud-iid-certs)")
	}
	csr, err := pki.ParseCSR(m.GetCsr())
	if err != nil {
		return nil, connectErr(connect.CodeInvalidArgument, "csr: %v", err)
	}
	iid := m.GetCloudIid()
	doc, err := cloudiid.Verify(cloudiid.Evidence{Document: iid.GetDocument(), Signature: iid.GetSignature()}, s.cfg.CloudIIDCerts)
	if err != nil {
		return nil, refuse("%v", err)
	}
	now := s.now()
	maxAge := s.cfg.CloudIIDMaxAge
	if maxAge == 0 {
		maxAge = DefaultCloudIIDMaxAge
	}
	switch age := now.Sub(doc.PendingTime); {
	case doc.PendingTime.IsZero():
		return nil, refuse("the identity document has no pendingTime")
	case maxAge > 0 && age > maxAge:
		return nil, refuse("the identity document is too old: instance %s launched %s ago, more than %s (bcgw serve --cloud-iid-max-age)",
			doc.InstanceID, age.Round(time.Second), maxAge)
	case age < -10*time.Minute:
		return nil, refuse("the identity document's pendingTime is %s ahead of the gateway's clock", (-age).Round(time.Second))
	}
	// One admission at a time: an instance is admitted once.
	s.cloudMu.Lock()
	defer s.cloudMu.Unlock()
	nodes, err := s.store.Nodes()
	if err != nil {
		return nil, connectErr(connect.CodeUnavailable, "store: %v", err)
	}
	for _, n := range nodes {
		if n.CloudInstanceID == doc.InstanceID {
			return nil, refuse("instance %s already joined as %s: an identity document is admitted once (join again with --reset and a join token)", doc.InstanceID, n.ID)
		}
	}
	rule, err := s.cloudRule(doc, m.GetRole(), now)
	if err != nil {
		return nil, refuse("%v", err)
	}
	tok, err := s.store.SpendTokenIf(rule.ID, s.RuleSecret(rule.ID), m.GetRole(), now, func(t store.Token) error {
		if t.CloudAccount != doc.AccountID {
			return errors.New("the rule changed")
		}
		return nil
	})
	if err != nil {
		return nil, refuse("cloud-iid rule %s: %v", rule.ID, err)
	}
	n := store.Node{
		ID: "node_" + fleet.RandomID(13), Role: m.GetRole(), Site: tok.Site, Hostname: m.GetClaims().GetHostname(),
		JoinedAt: now.UTC(), TokenID: tok.ID, CloudAccount: doc.AccountID, CloudInstanceID: doc.InstanceID,
	}
	resp, err := s.admit(n, csr, sha256.Sum256(m.GetCsr()))
	if err != nil {
		return nil, err
	}
	log.Info("node joined", "node", n.ID, "site", n.Site, "token_id", tok.ID, "account", doc.AccountID, "instance", doc.InstanceID, "region", doc.Region)
	return resp, nil
}

// cloudRule is a cloud-iid rule that admits doc's account and region for
// role, not expired, with a use left.
func (s *Service) cloudRule(doc cloudiid.Document, role string, now time.Time) (store.Token, error) {
	toks, err := s.store.Tokens()
	if err != nil {
		return store.Token{}, err
	}
	for _, t := range toks {
		if t.CloudAccount == doc.AccountID && (t.CloudRegion == "" || t.CloudRegion == doc.Region) && t.Role == role &&
			(t.ExpiresAt.IsZero() || now.Before(t.ExpiresAt)) && t.Used < t.Uses {
			return t, nil
		}
	}
	return store.Token{}, fmt.Errorf("no cloud-iid rule admits account %s in region %s as a %s (bcgw token create --cloud-iid-account)", doc.AccountID, doc.Region, role)
}
