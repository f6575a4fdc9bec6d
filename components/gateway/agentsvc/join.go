package agentsvc

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"google.golang.org/protobuf/proto"
)

type peerKey struct{}

// WithPeer is h with the verified client certificate, if any, in each
// request's context, where the RPCs find their node (peerNode).
func WithPeer(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			r = r.WithContext(context.WithValue(r.Context(), peerKey{}, r.TLS.VerifiedChains[0][0]))
		}
		h.ServeHTTP(w, r)
	})
}

func connectErr(code connect.Code, format string, a ...any) error {
	return connect.NewError(code, fmt.Errorf(format, a...))
}

// tokenParts splits bcjt_<id>_<secret>.
func tokenParts(tok string) (id, secret string, ok bool) {
	rest, found := strings.CutPrefix(tok, "bcjt_")
	if !found {
		return "", "", false
	}
	id, secret, ok = strings.Cut(rest, "_")
	return id, secret, ok && id != "" && secret != ""
}

func (s *Service) signResult(r *bcdv1.JoinResult) (*bcdv1.JoinResponse, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return nil, err
	}
	sig, err := pki.Sign(s.keys.JoinSigning, pki.PurposeJoinResponse, b)
	if err != nil {
		return nil, err
	}
	return &bcdv1.JoinResponse{Result: b, Signature: sig, SigningKey: s.keys.SigningSPKI}, nil
}

func (s *Service) issue(n store.Node, csr *x509.CertificateRequest) (*x509.Certificate, error) {
	spiffe := pki.SPIFFEID(s.cfg.TrustDomain, n.Role, n.ID)
	return s.keys.NodeCA.IssueClient(csr.PublicKey, n.ID, spiffe, n.Site, s.cfg.CertValidity, akExtension(n)...)
}

// Join admits an agent with a sealed join token.
func (s *Service) Join(ctx context.Context, req *connect.Request[bcdv1.JoinRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	m := req.Msg
	log := s.log.With("rpc", "Join", "role", m.GetRole())
	if wait := s.joins.take(); wait > 0 {
		return nil, joinBusy(s.joins.rate, wait)
	}
	if m.GetAttestor() == "tpm" {
		return s.joinTPM(ctx, m)
	}
	if m.GetAttestor() == "cloud-iid" {
		return s.joinCloudIID(m)
	}
	switch a := m.GetAttestor(); {
	case (a == "" || a == "join-token") && (m.GetRole() == "node" || m.GetRole() == "site"):
	case a == "discovery" && m.GetRole() == "ramdisk":
	case a == "provisioned" && m.GetRole() == "node":
	case a == "" || a == "join-token" || a == "discovery" || a == "provisioned":
		return nil, connectErr(connect.CodeInvalidArgument, "role %q cannot join with attestor %q", m.GetRole(), a)
	default:
		return nil, connectErr(connect.CodeUnimplemented, "attestor %q is not supported by this gateway", a)
	}
	csr, err := pki.ParseCSR(m.GetCsr())
	if err != nil {
		return nil, connectErr(connect.CodeInvalidArgument, "csr: %v", err)
	}
	sealed, err := pki.OpenToken(s.keys.EncJWK, m.GetSealedToken())
	if err != nil {
		log.Warn("join refused", "reason", "sealed token does not open")
		return nil, connectErr(connect.CodeInvalidArgument, "sealed token does not open with this gateway's join encryption key")
	}
	sum := sha256.Sum256(m.GetCsr())
	if sealed.CSRSHA256 != fmt.Sprintf("%x", sum) {
		log.Warn("join refused", "reason", "sealed token bound to another CSR")
		return nil, connectErr(connect.CodePermissionDenied, "sealed token is bound to another CSR")
	}
	if d := s.now().Sub(time.Unix(sealed.IssuedAt, 0)); d > 10*time.Minute || d < -10*time.Minute {
		return nil, connectErr(connect.CodePermissionDenied, "sealed token was made %s from the gateway's time; check the clock", d.Round(time.Second))
	}
	id, secret, ok := tokenParts(sealed.Token)
	if !ok {
		log.Warn("join refused", "reason", "malformed token")
		return nil, connectErr(connect.CodePermissionDenied, "join token is not valid")
	}
	tok, err := s.store.SpendTokenIf(id, secret, m.GetRole(), s.now(), func(t store.Token) error {
		if t.CloudAccount != "" {
			return errors.New("join token is not valid")
		}
		return fleet.ProvisionedBinding(m.GetAttestor(), t)
	})
	if err != nil {
		log.Warn("join refused", "token_id", id, "reason", err.Error())
		return nil, connect.NewError(connect.CodePermissionDenied, err)
	}
	n := store.Node{
		ID: "node_" + fleet.RandomID(13), Role: m.GetRole(), Site: tok.Site, Hostname: m.GetClaims().GetHostname(),
		JoinedAt: s.now().UTC(), TokenID: tok.ID, MAC: tok.MAC,
	}
	if err := s.CheckProvisioned(m.GetAttestor(), tok, &n); err != nil {
		log.Warn("join refused", "token_id", tok.ID, "reason", err.Error())
		return nil, connect.NewError(connect.CodePermissionDenied, err)
	}
	if m.GetAttestor() == "discovery" {
		if err := s.checkAssertion(m.GetAssertion(), sealed.Token, tok); err != nil {
			log.Warn("join refused", "token_id", tok.ID, "reason", err.Error())
			return nil, connectErr(connect.CodePermissionDenied, "discovery assertion: %v", err)
		}
	}
	resp, err := s.admit(n, csr, sum)
	if err != nil {
		return nil, err
	}
	if tok.NodeID != "" {
		// A new OS took the node's id: its agent counts events from 1.
		if err := s.store.DeleteEvents(n.ID); err != nil {
			log.Warn("events of the replaced node not deleted", "node", n.ID, "err", err)
		}
	}
	log.Info("node joined", "node", n.ID, "site", n.Site, "token_id", tok.ID, "hostname", n.Hostname)
	return resp, nil
}

// admit issues an admitted node its certificate, stores the node and
// answers the signed JoinResponse; sum is sha256 of its CSR.
func (s *Service) admit(n store.Node, csr *x509.CertificateRequest, sum [32]byte) (*connect.Response[bcdv1.JoinResponse], error) {
	cert, err := s.issue(n, csr)
	if err != nil {
		return nil, connectErr(connect.CodeInternal, "issue certificate: %v", err)
	}
	n.SPIFFEID, n.CertSerial, n.NotAfter = cert.URIs[0].String(), cert.SerialNumber.Text(16), cert.NotAfter
	n.PublicKey = cert.RawSubjectPublicKeyInfo
	if err := s.store.PutNode(n); err != nil {
		return nil, connectErr(connect.CodeUnavailable, "store node: %v", err)
	}
	resp, err := s.signResult(&bcdv1.JoinResult{
		NodeId: n.ID, Site: n.Site, Role: n.Role, SpiffeId: n.SPIFFEID, Certificate: cert.Raw,
		CsrSha256: sum[:], NotAfterUnix: cert.NotAfter.Unix(), ServerTimeUnixMs: s.now().UnixMilli(),
	})
	if err != nil {
		return nil, connectErr(connect.CodeInternal, "sign join response: %v", err)
	}
	return connect.NewResponse(resp), nil
}

// peerNode returns the node record of the mTLS client certificate.
func (s *Service) peerNode(ctx context.Context) (store.Node, *x509.Certificate, error) {
	cert, _ := ctx.Value(peerKey{}).(*x509.Certificate)
	return s.nodeOfCert(cert)
}

// nodeOfCert returns the node record of a verified node certificate.
func (s *Service) nodeOfCert(cert *x509.Certificate) (store.Node, *x509.Certificate, error) {
	if cert == nil || len(cert.URIs) != 1 {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "a node certificate is required")
	}
	td, _, nodeID, err := pki.ParseSPIFFEID(cert.URIs[0])
	if err != nil || td != s.cfg.TrustDomain {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "certificate names no node of this gateway")
	}
	n, err := s.store.Node(nodeID)
	if err != nil {
		return store.Node{}, nil, connectErr(connect.CodeUnauthenticated, "unknown node %s", nodeID)
	}
	return n, cert, nil
}

// Renew issues a certificate for a new key, proven by the current one.
func (s *Service) Renew(ctx context.Context, req *connect.Request[bcdv1.RenewRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	n, cert, err := s.peerNode(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := s.renew(n, cert, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// renew issues node n, whose certificate cert the agent proved it holds,
// a certificate for the new key of req.
func (s *Service) renew(n store.Node, cert *x509.Certificate, msg *bcdv1.RenewRequest) (*bcdv1.JoinResponse, error) {
	if n.Revoked {
		return nil, connectErr(connect.CodePermissionDenied, "this node's certificate was revoked")
	}
	if !n.Current(cert.SerialNumber.Text(16)) {
		return nil, connectErr(connect.CodeUnauthenticated, "certificate was superseded")
	}
	if err := pki.Verify(cert.PublicKey, pki.PurposeRenew, msg.GetCsr(), msg.GetProof()); err != nil {
		return nil, connectErr(connect.CodePermissionDenied, "renewal proof does not verify with the current key")
	}
	csr, err := pki.ParseCSR(msg.GetCsr())
	if err != nil {
		return nil, connectErr(connect.CodeInvalidArgument, "csr: %v", err)
	}
	if err := s.checkRenewalCertification(n, msg, csr); err != nil {
		s.log.Warn("renewal refused", "node", n.ID, "reason", err.Error())
		return nil, err
	}
	nc, err := s.issue(n, csr)
	if err != nil {
		return nil, connectErr(connect.CodeInternal, "issue certificate: %v", err)
	}
	if _, err := s.store.UpdateNode(n.ID, func(x *store.Node) error {
		x.PrevCertSerial, x.CertSerial, x.NotAfter = cert.SerialNumber.Text(16), nc.SerialNumber.Text(16), nc.NotAfter
		x.PrevPublicKey, x.PublicKey = cert.RawSubjectPublicKeyInfo, nc.RawSubjectPublicKeyInfo
		return nil
	}); err != nil {
		return nil, connectErr(connect.CodeUnavailable, "store node: %v", err)
	}
	sum := sha256.Sum256(msg.GetCsr())
	resp, err := s.signResult(&bcdv1.JoinResult{
		NodeId: n.ID, Site: n.Site, Role: n.Role, SpiffeId: n.SPIFFEID, Certificate: nc.Raw,
		CsrSha256: sum[:], NotAfterUnix: nc.NotAfter.Unix(), ServerTimeUnixMs: s.now().UnixMilli(),
	})
	if err != nil {
		return nil, connectErr(connect.CodeInternal, "sign renewal: %v", err)
	}
	s.log.Info("node renewed", "node", n.ID, "not_after", nc.NotAfter)
	return resp, nil
}
