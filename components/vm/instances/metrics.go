package instances

import (
	"context"
	"strconv"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/agent/telemetry"
)

// Metrics is the telemetry section's source of the instances' metrics
// (docs/telemetry.md): bcd.instance.state, one point of value 1 per
// domain the runtime listed at the last pass (its id, state, and whether
// bcd made it); bcd.instance.failed, 1 for an instance that failed alone
// (InstanceFailed), 0 for the others bcd runs; and bcd.instances.complete,
// 0 when the runtime could not list its domains. list is Section.Status.
func Metrics(list func() ([]status.Instance, bool)) telemetry.Source {
	return func(context.Context) []telemetry.Metric {
		all, complete := list()
		state := telemetry.Metric{Name: "bcd.instance.state", Unit: "1", Kind: telemetry.Gauge,
			Description: "1 per domain the runtime lists, by instance id and state; owned says bcd made it"}
		failed := telemetry.Metric{Name: "bcd.instance.failed", Unit: "1", Kind: telemetry.Gauge,
			Description: "1 for an instance that failed alone (InstanceFailed)"}
		for _, in := range all {
			id := telemetry.Attr{Key: "bcd.instance.id", Value: in.ID}
			if in.State != "" {
				state.Points = append(state.Points, telemetry.Point{Value: 1, Attrs: []telemetry.Attr{id,
					{Key: "state", Value: in.State}, {Key: "owned", Value: strconv.FormatBool(in.Owned)}}})
			}
			if in.Owned || in.Failed != "" {
				v := 0.0
				if in.Failed != "" {
					v = 1
				}
				failed.Points = append(failed.Points, telemetry.Point{Value: v, Attrs: []telemetry.Attr{id}})
			}
		}
		c := 0.0
		if complete {
			c = 1
		}
		out := []telemetry.Metric{telemetry.Value("bcd.instances.complete", "1",
			"1 when the runtime listed all its domains at the last pass", telemetry.Gauge, c)}
		for _, m := range []telemetry.Metric{state, failed} {
			if len(m.Points) > 0 {
				out = append(out, m)
			}
		}
		return out
	}
}
