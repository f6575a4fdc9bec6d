package gateway

import (
	"net/http"
	"net/http/pprof"
	"runtime"
)

// profiles serves Go's profiles at /debug/pprof/ (bcgw serve --profile,
// on the metrics listener only): what a stall of the command round trip
// is waiting for is in the blocking and lock profiles and the execution
// trace, not in the metrics' histograms. Blocking events of 100 µs or
// more and one lock contention in 10 are recorded from then on, which
// costs a little on every channel and lock operation, so it is off by
// default.
func profiles(mux *http.ServeMux) {
	runtime.SetBlockProfileRate(100_000) // ns
	runtime.SetMutexProfileFraction(10)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
}
