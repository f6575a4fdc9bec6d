package telemetry

import (
	"errors"
	"maps"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// scopeName is the instrumentation scope of every metric bcd exports.
const scopeName = "github.com/better-compute/bcd"

// The OTLP field numbers encode writes (opentelemetry-proto's
// metrics/v1, common/v1 and resource/v1). The request is an
// ExportMetricsServiceRequest: resource_metrics, field 1.
const (
	fResourceMetrics = 1 // ExportMetricsServiceRequest.resource_metrics
	fResource        = 1 // ResourceMetrics.resource
	fScopeMetrics    = 2 // ResourceMetrics.scope_metrics
	fResAttributes   = 1 // Resource.attributes
	fScope           = 1 // ScopeMetrics.scope
	fMetrics         = 2 // ScopeMetrics.metrics
	fScopeName       = 1 // InstrumentationScope.name
	fScopeVersion    = 2 // InstrumentationScope.version
	fName            = 1 // Metric.name
	fDescription     = 2 // Metric.description
	fUnit            = 3 // Metric.unit
	fGauge           = 5 // Metric.gauge
	fSum             = 7 // Metric.sum
	fDataPoints      = 1 // Gauge.data_points, Sum.data_points
	fTemporality     = 2 // Sum.aggregation_temporality
	fMonotonic       = 3 // Sum.is_monotonic
	fStart           = 2 // NumberDataPoint.start_time_unix_nano
	fTime            = 3 // NumberDataPoint.time_unix_nano
	fAsDouble        = 4 // NumberDataPoint.as_double
	fPointAttributes = 7 // NumberDataPoint.attributes
	fKey             = 1 // KeyValue.key
	fValue           = 2 // KeyValue.value
	fStringValue     = 1 // AnyValue.string_value

	temporalityCumulative = 2 // AGGREGATION_TEMPORALITY_CUMULATIVE
)

// encode renders metrics taken at now as an OTLP ExportMetricsServiceRequest
// in protobuf. bcd writes the few messages it needs with protowire rather
// than linking the generated OTLP types, whose module brings gRPC into
// bcd's module graph (docs/decisions.md). Gauges are double gauges,
// counters cumulative monotonic sums from start. It returns the bytes and
// how many points they hold.
func encode(resource map[string]string, ms []Metric, start, now time.Time, version string) ([]byte, int) {
	var res []byte
	for _, k := range slices.Sorted(maps.Keys(resource)) {
		res = message(res, fResAttributes, keyValue(nil, k, resource[k]))
	}
	scope := message(nil, fScope, str(str(nil, fScopeName, scopeName), fScopeVersion, version))
	points := 0
	at, from := uint64(now.UnixNano()), uint64(start.UnixNano())
	for _, m := range ms {
		if len(m.Points) == 0 {
			continue
		}
		var data []byte
		for _, p := range m.Points {
			var dp []byte
			if m.Kind == Counter {
				dp = fixed(dp, fStart, from)
			}
			dp = fixed(dp, fTime, at)
			dp = fixed(dp, fAsDouble, math.Float64bits(p.Value))
			for _, a := range p.Attrs {
				dp = message(dp, fPointAttributes, keyValue(nil, a.Key, a.Value))
			}
			data = message(data, fDataPoints, dp)
		}
		points += len(m.Points)
		om := str(nil, fName, m.Name)
		om = str(om, fDescription, m.Description)
		om = str(om, fUnit, m.Unit)
		if m.Kind == Counter {
			data = protowire.AppendVarint(protowire.AppendTag(data, fTemporality, protowire.VarintType), temporalityCumulative)
			data = protowire.AppendVarint(protowire.AppendTag(data, fMonotonic, protowire.VarintType), 1)
			om = message(om, fSum, data)
		} else {
			om = message(om, fGauge, data)
		}
		scope = message(scope, fMetrics, om)
	}
	rm := message(message(nil, fResource, res), fScopeMetrics, scope)
	return message(nil, fResourceMetrics, rm), points
}

// message appends field num holding the message m.
func message(b []byte, num protowire.Number, m []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), m)
}

// str appends field num holding s; an empty s is left out, as proto3 does.
func str(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func fixed(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), v)
}

// keyValue is a KeyValue with a string AnyValue.
func keyValue(b []byte, k, v string) []byte {
	return message(str(b, fKey, k), fValue, protowire.AppendString(protowire.AppendTag(nil, fStringValue, protowire.BytesType), v))
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
