package dispatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DecodeBody decodes a command body strictly: one JSON value with no
// unknown fields and nothing after it; numbers in untyped places stay
// json.Number. Every kind decodes its body with it.
func DecodeBody(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("body: trailing data after the JSON value")
	}
	return nil
}
