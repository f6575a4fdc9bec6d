package update

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

// FuzzDaemonSpec: the daemon section and daemon.upgrade's body, from the
// gateway, never panic; a section that passes Check is one the agent
// can plan without touching the slots when it names the running version.
func FuzzDaemonSpec(f *testing.F) {
	for _, s := range []string{`{}`, `{"version":"0.2.0","release_url":"https://r.example/x"}`, `{"version":"0.2.0","release":{"payload":"","signatures":[]}}`,
		`{"version":"0.2.0","release":"AAAA"}`, `{"release":{}}`, `null`, `[]`, `{"version":"x"}`} {
		f.Add([]byte(s))
	}
	a := &Agent{Version: "0.2.0", Installer: &Manager{Slots: &Slots{Dir: "/nonexistent"}}}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := a.Section()
		if err := s.Check(b); err == nil {
			var d DaemonSpec
			json.Unmarshal(b, &d)
			if d.Version == "0.2.0" || d.Version == "" {
				if p, err := s.Plan(context.Background(), b); err != nil || len(p.Changes) != 0 {
					t.Fatalf("Plan(%s) = %+v, %v", b, p, err)
				}
			}
		}
		var body Body
		if dispatch.DecodeBody(b, &body) == nil && body.ReleaseURL == "" {
			a.document(context.Background(), body)
		}
	})
}
