package telemetry

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	metricsv1 "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcev1 "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// scopeName is the instrumentation scope of every metric bcd exports.
const scopeName = "github.com/better-compute/bcd"

// encode renders metrics taken at now as an OTLP export request. The
// request is MetricsData, whose wire form is the same as
// ExportMetricsServiceRequest's (one repeated ResourceMetrics, field 1),
// so the collector service package (and the gRPC code it pulls in) is not
// linked. Gauges are double gauges; counters cumulative monotonic sums
// from start. It returns the bytes and how many points they hold.
func encode(resource map[string]string, ms []Metric, start, now time.Time, version string) ([]byte, int, error) {
	res := &resourcev1.Resource{}
	for _, k := range slices.Sorted(maps.Keys(resource)) {
		res.Attributes = append(res.Attributes, kv(k, resource[k]))
	}
	scope := &metricsv1.ScopeMetrics{Scope: &commonv1.InstrumentationScope{Name: scopeName, Version: version}}
	points := 0
	at, from := uint64(now.UnixNano()), uint64(start.UnixNano())
	for _, m := range ms {
		if len(m.Points) == 0 {
			continue
		}
		dps := make([]*metricsv1.NumberDataPoint, 0, len(m.Points))
		for _, p := range m.Points {
			dp := &metricsv1.NumberDataPoint{TimeUnixNano: at, Value: &metricsv1.NumberDataPoint_AsDouble{AsDouble: p.Value}}
			for _, a := range p.Attrs {
				dp.Attributes = append(dp.Attributes, kv(a.Key, a.Value))
			}
			if m.Kind == Counter {
				dp.StartTimeUnixNano = from
			}
			dps = append(dps, dp)
		}
		points += len(dps)
		om := &metricsv1.Metric{Name: m.Name, Unit: m.Unit, Description: m.Description}
		if m.Kind == Counter {
			om.Data = &metricsv1.Metric_Sum{Sum: &metricsv1.Sum{DataPoints: dps, IsMonotonic: true,
				AggregationTemporality: metricsv1.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE}}
		} else {
			om.Data = &metricsv1.Metric_Gauge{Gauge: &metricsv1.Gauge{DataPoints: dps}}
		}
		scope.Metrics = append(scope.Metrics, om)
	}
	md := &metricsv1.MetricsData{ResourceMetrics: []*metricsv1.ResourceMetrics{{Resource: res, ScopeMetrics: []*metricsv1.ScopeMetrics{scope}}}}
	b, err := proto.Marshal(md)
	if err != nil {
		return nil, 0, fmt.Errorf("encoding metrics: %w", err)
	}
	return b, points, nil
}

func kv(k, v string) *commonv1.KeyValue {
	return &commonv1.KeyValue{Key: k, Value: &commonv1.AnyValue{Value: &commonv1.AnyValue_StringValue{StringValue: v}}}
}

// partialSuccess reads an ExportMetricsServiceResponse: its
// partial_success (field 1) with rejected_data_points (1) and
// error_message (2). An empty body is full success.
func partialSuccess(b []byte) (rejected int64, msg string, err error) {
	ps, err := field(b, 1, protowire.BytesType)
	if err != nil || ps == nil {
		return 0, "", err
	}
	for len(ps) > 0 {
		num, typ, n := protowire.ConsumeTag(ps)
		if n < 0 {
			return 0, "", errors.New("malformed partial_success")
		}
		ps = ps[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(ps)
			if m < 0 {
				return 0, "", errors.New("malformed rejected_data_points")
			}
			rejected, ps = int64(v), ps[m:]
		case num == 2 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(ps)
			if m < 0 {
				return 0, "", errors.New("malformed error_message")
			}
			msg, ps = string(v), ps[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, ps)
			if m < 0 {
				return 0, "", errors.New("malformed partial_success")
			}
			ps = ps[m:]
		}
	}
	return rejected, msg, nil
}

// field returns the last value of field num (of wire type bytes) in b,
// nil when absent.
func field(b []byte, num protowire.Number, want protowire.Type) ([]byte, error) {
	var out []byte
	for len(b) > 0 {
		n, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return nil, errors.New("malformed response")
		}
		b = b[m:]
		if n == num && typ == want {
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return nil, errors.New("malformed response")
			}
			out, b = v, b[k:]
			continue
		}
		k := protowire.ConsumeFieldValue(n, typ, b)
		if k < 0 {
			return nil, errors.New("malformed response")
		}
		b = b[k:]
	}
	return out, nil
}
