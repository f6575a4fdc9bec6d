package telemetry

import (
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// request is an ExportMetricsServiceRequest as the tests read it back:
// the resource's attributes and each metric's points.
type request struct {
	resource map[string]string
	metrics  map[string][]decodedPoint
	counters map[string]bool
}

type decodedPoint struct {
	attrs map[string]string
	value float64
	start uint64
}

type wireField struct {
	num protowire.Number
	typ protowire.Type
	b   []byte
	u   uint64
}

// fieldsOf splits one message into its fields; malformed bytes are an
// error.
func fieldsOf(b []byte) ([]wireField, error) {
	var out []wireField
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		f := wireField{num: num, typ: typ}
		switch typ {
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		case protowire.Fixed64Type:
			f.u, n = protowire.ConsumeFixed64(b)
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		b = b[n:]
		out = append(out, f)
	}
	return out, nil
}

func sub(b []byte, num protowire.Number) [][]byte {
	fs, _ := fieldsOf(b)
	var out [][]byte
	for _, f := range fs {
		if f.num == num && f.typ == protowire.BytesType {
			out = append(out, f.b)
		}
	}
	return out
}

func strField(b []byte, num protowire.Number) string {
	v := sub(b, num)
	if len(v) == 0 {
		return ""
	}
	return string(v[len(v)-1])
}

func kvs(list [][]byte) map[string]string {
	m := map[string]string{}
	for _, kv := range list {
		val := sub(kv, fValue)
		if len(val) > 0 {
			m[strField(kv, fKey)] = strField(val[0], fStringValue)
		}
	}
	return m
}

func decodeRequest(b []byte) (request, error) {
	if _, err := fieldsOf(b); err != nil {
		return request{}, err
	}
	r := request{resource: map[string]string{}, metrics: map[string][]decodedPoint{}, counters: map[string]bool{}}
	for _, rm := range sub(b, fResourceMetrics) {
		for _, res := range sub(rm, fResource) {
			r.resource = kvs(sub(res, fResAttributes))
		}
		for _, sm := range sub(rm, fScopeMetrics) {
			for _, m := range sub(sm, fMetrics) {
				name := strField(m, fName)
				data := sub(m, fGauge)
				if s := sub(m, fSum); len(s) > 0 {
					data, r.counters[name] = s, true
				}
				if len(data) != 1 {
					return request{}, fmt.Errorf("metric %s has %d data", name, len(data))
				}
				for _, dp := range sub(data[0], fDataPoints) {
					fs, err := fieldsOf(dp)
					if err != nil {
						return request{}, err
					}
					p := decodedPoint{attrs: kvs(sub(dp, fPointAttributes))}
					for _, f := range fs {
						switch f.num {
						case fAsDouble:
							p.value = math.Float64frombits(f.u)
						case fStart:
							p.start = f.u
						}
					}
					r.metrics[name] = append(r.metrics[name], p)
				}
			}
		}
	}
	return r, nil
}
