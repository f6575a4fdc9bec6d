package gateway

import "net/http"

// The gateway's own health: whether its database answers. A gateway
// whose database is lost can hold sessions but store nothing, so every
// call of its agents fails after opTimeout. It says so three ways
// (docs/gateway-store.md, "A database lost while serving"): a log line
// when the database stops and starts answering, `bcgw health` on the
// admin API with the error, and GET /readyz on the agents' port, which a
// balancer's health check reads to send agents to another gateway.

func (s *Server) adminHealth(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.Health()) }

// serveReady answers the balancer's health check.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	switch {
	case !s.DatabaseReachable():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("database unreachable\n"))
		return
	case s.hub.Draining():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("shutting down\n"))
		return
	}
	w.Write([]byte("ready\n"))
}
