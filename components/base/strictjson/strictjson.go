// Package strictjson decodes one JSON value strictly: every object key
// must name a field of the target (encoding/json's DisallowUnknownFields)
// and nothing but whitespace may follow the value. The documents bcd
// signs, checks or stores (release manifests, trust bundles, proofs,
// sections, SSH fields) are read with it, so a field a newer writer adds,
// or a second document appended to the first, is refused rather than
// silently dropped.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// ErrTrailing is returned for data after the JSON value.
var ErrTrailing = errors.New("data after the JSON value")

// Decode decodes b into v strictly.
func Decode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return ErrTrailing
	}
	return nil
}
