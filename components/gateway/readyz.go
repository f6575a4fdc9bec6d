package gateway

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// The balancer's health check on a listener of its own (--health): plain
// HTTP, GET /readyz only. On the agents' port the check is a TLS
// handshake like any agent's, and when thousands of agents redial at once
// (a gateway killed) it waits in the handshake queue (agentsvc/admission.go)
// behind them: HAProxy then times it out, marks the busiest gateway down,
// and the fleet's agents have nowhere to go. Here it waits for nothing.
// It says only ready or not, as /readyz on the agents' port does, so it
// needs no TLS (docs/gateway-store.md, "HAProxy in front").

// listenHealth listens for the health check when --health is set (nil,
// nil when it is not).
func (s *Server) listenHealth() (*http.Server, net.Listener, error) {
	if s.cfg.HealthListen == "" {
		return nil, nil, nil
	}
	ln, err := net.Listen("tcp", s.cfg.HealthListen)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s (--health): %w", s.cfg.HealthListen, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.ReadyPath, s.svc.ServeReady)
	s.mu.Lock()
	s.healthAddr = ln.Addr()
	s.mu.Unlock()
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 4 << 10}, ln, nil
}

// HealthAddr is the bound health-check address once Run listens (nil
// without --health).
func (s *Server) HealthAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.healthAddr
}
