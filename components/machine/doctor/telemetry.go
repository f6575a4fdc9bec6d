package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/agent/telemetry"
)

// TelemetryTimeout bounds the telemetry check's TLS connection.
const TelemetryTimeout = 5 * time.Second

// Telemetry checks the collector of the telemetry section in the spec the
// agent holds (data_dir/spec.json): it warns when the collector takes no
// TLS connection the exporter would trust within TelemetryTimeout. No
// stored spec, or none with a telemetry section, is ok.
func Telemetry(dataDir string) Check {
	return Check{Name: "telemetry", Run: func(ctx context.Context) Result {
		r := Result{Name: "telemetry", Status: OK}
		b, err := os.ReadFile(filepath.Join(dataDir, converge.SpecFile))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			r.Detail = "no desired state held yet"
			return r
		case err != nil:
			r.Status, r.Detail = Warn, fmt.Sprintf("cannot read the held spec as this user: %v", err)
			return r
		}
		var held struct {
			Spec map[string]json.RawMessage `json:"spec"`
		}
		if err := json.Unmarshal(b, &held); err != nil {
			r.Status, r.Detail = Warn, fmt.Sprintf("the held spec does not decode: %v", err)
			return r
		}
		s, err := telemetry.Parse(held.Spec["telemetry"])
		switch {
		case err != nil:
			r.Status, r.Detail = Warn, err.Error()
			return r
		case s == nil:
			r.Detail = "no telemetry section"
			return r
		}
		ctx, cancel := context.WithTimeout(ctx, TelemetryTimeout)
		defer cancel()
		if err := telemetry.Probe(ctx, s); err != nil {
			r.Status, r.Detail = Warn, fmt.Sprintf("the collector %s is unreachable: %v", s.Endpoint, err)
			return r
		}
		r.Detail = fmt.Sprintf("the collector %s takes a trusted TLS connection", s.Endpoint)
		return r
	}}
}
