package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/metrics"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// MetricsPath is where the metrics listener serves bcgw's own metrics.
const MetricsPath = "/metrics"

// metered is the agent service with its Joins counted.
type metered struct {
	*agentsvc.Service
	m *metrics.Metrics
}

func (x metered) Join(ctx context.Context, req *connect.Request[bcdv1.JoinRequest]) (*connect.Response[bcdv1.JoinResponse], error) {
	resp, err := x.Service.Join(ctx, req)
	x.m.Joined(req.Msg.GetRole(), err == nil && resp != nil && len(resp.Msg.GetResult()) > 0, err)
	return resp, err
}

// metricsAddr is the address --metrics names: a bare port ("9464" or
// ":9464") is on loopback; an address with a host is taken as it is.
func metricsAddr(a string) (string, error) {
	if _, err := strconv.ParseUint(a, 10, 16); err == nil {
		return net.JoinHostPort("127.0.0.1", a), nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return "", fmt.Errorf("--metrics %q: want PORT or HOST:PORT: %w", a, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// listenMetrics listens for scrapes when --metrics is set (nil, nil when
// it is not).
func (s *Server) listenMetrics() (*http.Server, net.Listener, error) {
	if s.cfg.MetricsListen == "" {
		return nil, nil, nil
	}
	addr, err := metricsAddr(s.cfg.MetricsListen)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s (--metrics): %w", addr, err)
	}
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		s.log.Warn("metrics served beyond loopback, without authentication: they show the fleet's size and activity", "metrics_addr", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+MetricsPath, s.metrics.Handler())
	if s.cfg.Profile {
		profiles(mux)
		s.log.Warn("profiles served at /debug/pprof/ beside the metrics (--profile): CPU, heap, goroutines, blocking, locks and an execution trace", "metrics_addr", ln.Addr().String())
	}
	s.mu.Lock()
	s.metricsAddr = ln.Addr()
	s.mu.Unlock()
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln, nil
}

// MetricsAddr is the bound metrics address once Run listens (nil without
// --metrics).
func (s *Server) MetricsAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.metricsAddr
}
