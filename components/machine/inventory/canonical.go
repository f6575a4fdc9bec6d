package inventory

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Canonical encodes v as canonical JSON, the form every section is hashed
// in, and which another implementation must reproduce byte for byte:
//
//   - v is first encoded with encoding/json (field names from the json tags);
//   - object keys are sorted by their UTF-8 bytes;
//   - members whose value is null, an empty array or an empty object are
//     left out (so a nil slice and an empty one encode alike);
//   - no whitespace outside strings, and no trailing newline;
//   - strings are escaped as encoding/json does, except that <, > and & are
//     written as themselves;
//   - numbers are written as encoding/json wrote them (integers without a
//     fraction or exponent, floats in their shortest form).
//
// Slices are not reordered here: Sections sorts them by their stable keys
// (name, UUID, index) first.
func Canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var tree any
	if err := d.Decode(&tree); err != nil {
		return nil, fmt.Errorf("decode %T: %w", v, err)
	}
	tree, _ = prune(tree)
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	if err := e.Encode(tree); err != nil {
		return nil, fmt.Errorf("encode canonical %T: %w", v, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// prune drops null, empty-array and empty-object members; keep is false
// when v itself is one of those.
func prune(v any) (out any, keep bool) {
	switch t := v.(type) {
	case nil:
		return nil, false
	case map[string]any:
		for k, val := range t {
			p, ok := prune(val)
			if !ok {
				delete(t, k)
				continue
			}
			t[k] = p
		}
		return t, len(t) > 0
	case []any:
		out := t[:0]
		for _, val := range t {
			p, ok := prune(val)
			if !ok {
				// An element is never dropped from an array: that would
				// shift the others. Null and empty elements stay as they are.
				p = val
			}
			out = append(out, p)
		}
		return out, len(out) > 0
	default:
		return v, true
	}
}
