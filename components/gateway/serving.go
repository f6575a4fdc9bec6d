package gateway

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/pki"
)

// The serving leaf is issued at every start and valid 30 days; a gateway
// that runs longer renews it while it serves, once two thirds of its
// lifetime passed (checked hourly), and `bcgw serving-cert renew` renews
// it at once. New TLS handshakes get the new leaf; agents pin the serving
// CA, so none notices.

// servingCertificate is the TLS listener's GetCertificate.
func (s *Server) servingCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.servingMu.Lock()
	defer s.servingMu.Unlock()
	c := s.keys.Serving
	return &c, nil
}

// RenewServing issues a new serving leaf and presents it from the next
// handshake on.
func (s *Server) RenewServing() (adminapi.ServingView, error) {
	c, err := s.keys.IssueServing(s.cfg.ServerName, s.servingIPs)
	if err != nil {
		return adminapi.ServingView{}, err
	}
	s.servingMu.Lock()
	s.keys.Serving = c
	s.servingMu.Unlock()
	v := servingView(c)
	s.log.Info("serving certificate renewed", "serial", v.Serial, "not_after", v.NotAfter)
	return v, nil
}

func servingView(c tls.Certificate) adminapi.ServingView {
	return adminapi.ServingView{Serial: c.Leaf.SerialNumber.Text(16), NotBefore: c.Leaf.NotBefore.UTC(), NotAfter: c.Leaf.NotAfter.UTC()}
}

// servingDue reports whether a leaf valid from nb to na is past two
// thirds of its lifetime at now.
func servingDue(nb, na, now time.Time) bool {
	return !now.Before(nb.Add(na.Sub(nb) * 2 / 3))
}

// renewServing renews the serving leaf when it is due, every hour until
// ctx ends.
func (s *Server) renewServing(ctx context.Context) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.servingMu.Lock()
		leaf := s.keys.Serving.Leaf
		s.servingMu.Unlock()
		if servingDue(leaf.NotBefore, leaf.NotAfter, time.Now()) {
			if _, err := s.RenewServing(); err != nil {
				s.log.Error("serving certificate not renewed", "not_after", leaf.NotAfter, "err", err)
			}
		}
	}
}

// serverTLS is the agents' listener's TLS: the serving leaf as it is at
// each handshake, node certificates verified when given.
func (s *Server) serverTLS() *tls.Config {
	c := pki.ServerTLS(tls.Certificate{}, s.keys.NodeCA.Cert)
	c.Certificates = nil
	c.GetCertificate = s.servingCertificate
	return c
}
