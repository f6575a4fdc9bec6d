package agentsvc

import "net/http"

// ServeReady answers the balancer's health check.
func (s *Service) ServeReady(w http.ResponseWriter, r *http.Request) {
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
