// Package nodespec is the envelope of a NodeSpec that the gateway and
// every agent share: a JSON object of sections, at most MaxBytes, whose
// section names come from one fixed list in the fixed convergence order,
// full or as an RFC 7396 merge patch onto the held generation.
//
// What a section holds is its converger's business (components/agent/
// converge and the sections the roles compose); this package only knows
// the names, the order and the bounds. docs/nodespec.md documents each
// section.
package nodespec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	jsonpatch "github.com/evanphx/json-patch/v5"
)

// MaxBytes bounds a spec and a patch, before and after merging.
const MaxBytes = 4 << 20

// Order is every section a NodeSpec may name, in the order sections
// converge: host, devices, instances, access, telemetry, daemon, then the
// site agent's site section, then fakehw (the test section of fakehw
// builds).
var Order = []string{"host", "devices", "instances", "access", "telemetry", "daemon", "site", "fakehw"}

// Known reports whether name is a section of Order.
func Known(name string) bool { return slices.Contains(Order, name) }

// Spec is a decoded NodeSpec: section name to its JSON body.
type Spec map[string]json.RawMessage

// Decode parses a full spec: a JSON object of at most MaxBytes whose keys
// are known sections (a null section is the same as an absent one). It
// checks nothing inside the sections.
func Decode(b []byte) (Spec, error) {
	if len(b) > MaxBytes {
		return nil, fmt.Errorf("spec is %d bytes; at most %d (4 MiB)", len(b), MaxBytes)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, errors.New("spec is not a JSON object")
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("spec is not a JSON object: %w", err)
	}
	if dec.More() {
		return nil, errors.New("spec has data after its JSON object")
	}
	out := Spec{}
	for name, body := range raw {
		if !Known(name) {
			return nil, fmt.Errorf("unknown section %q (sections: %v)", name, Order)
		}
		if string(bytes.TrimSpace(body)) == "null" {
			continue
		}
		out[name] = body
	}
	return out, nil
}

// Encode returns s as compact JSON with its sections in Order (Go's
// encoding sorts map keys; the order is for people reading it).
func (s Spec) Encode() []byte {
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	for _, name := range Order {
		body, ok := s[name]
		if !ok {
			continue
		}
		if !first {
			buf.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(name)
		buf.Write(k)
		buf.WriteByte(':')
		var c bytes.Buffer
		if json.Compact(&c, body) == nil {
			buf.Write(c.Bytes())
		} else {
			buf.Write(body)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// Merge applies patch, an RFC 7396 merge patch, onto held (a full spec)
// and decodes the result. Neither input nor the result may exceed
// MaxBytes; a patch that is not a JSON object is refused (a merge patch
// that is not an object would replace the whole spec).
func Merge(held, patch []byte) (Spec, error) {
	if len(patch) > MaxBytes {
		return nil, fmt.Errorf("patch is %d bytes; at most %d (4 MiB)", len(patch), MaxBytes)
	}
	p := bytes.TrimSpace(patch)
	if len(p) == 0 || p[0] != '{' || !json.Valid(p) {
		return nil, errors.New("patch is not a JSON object")
	}
	if len(bytes.TrimSpace(held)) == 0 {
		held = []byte("{}")
	}
	merged, err := jsonpatch.MergePatch(held, p)
	if err != nil {
		return nil, fmt.Errorf("merge patch: %w", err)
	}
	return Decode(merged)
}
