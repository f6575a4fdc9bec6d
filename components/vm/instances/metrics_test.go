package instances

import (
	"context"
	"testing"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/telemetry"
)

// TestMetrics: a point per listed domain with its state and owner, the
// failed flag for bcd's instances and one that failed without a domain,
// and whether the list was complete.
func TestMetrics(t *testing.T) {
	list := []status.Instance{
		{ID: "web", State: "RUNNING", Owned: true},
		{ID: "db", State: "PAUSED", Owned: true},
		{ID: "hand", State: "RUNNING", Owned: false},
		{ID: "broken", Failed: "InstanceFailed: image digest differs"},
	}
	ms := Metrics(func() ([]status.Instance, bool) { return list, false })(context.Background())
	by := map[string]telemetry.Metric{}
	for _, m := range ms {
		by[m.Name] = m
	}
	if c := by["bcd.instances.complete"]; len(c.Points) != 1 || c.Points[0].Value != 0 {
		t.Errorf("complete %+v", c)
	}
	st := by["bcd.instance.state"]
	if len(st.Points) != 3 {
		t.Fatalf("state points %+v", st.Points)
	}
	attrs := func(p telemetry.Point) map[string]string {
		m := map[string]string{}
		for _, a := range p.Attrs {
			m[a.Key] = a.Value
		}
		return m
	}
	if a := attrs(st.Points[2]); a["bcd.instance.id"] != "hand" || a["owned"] != "false" || a["state"] != "RUNNING" {
		t.Errorf("hand-made domain %v", a)
	}
	f := by["bcd.instance.failed"]
	got := map[string]float64{}
	for _, p := range f.Points {
		got[attrs(p)["bcd.instance.id"]] = p.Value
	}
	if len(got) != 3 || got["web"] != 0 || got["db"] != 0 || got["broken"] != 1 {
		t.Errorf("failed %v (a domain bcd did not make has no failed point)", got)
	}
	if ms := Metrics(func() ([]status.Instance, bool) { return nil, true })(context.Background()); len(ms) != 1 || ms[0].Points[0].Value != 1 {
		t.Errorf("no instances: %+v", ms)
	}
}
