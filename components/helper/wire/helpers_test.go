package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
)

// jsonOf encodes r without Check, as a sender might.
func jsonOf(r *Request) ([]byte, error) { return json.Marshal(r) }

// normal makes empty and nil byte fields the same.
func normal(r *Request) Request {
	c := *r
	for _, b := range []*[]byte{&c.Data, &c.Unique, &c.Digest, &c.QualifyingData} {
		if len(*b) == 0 {
			*b = nil
		}
	}
	return c
}

// normalResponse makes empty and nil byte fields the same.
func normalResponse(r *Response) Response {
	c := *r
	for _, b := range []*[]byte{&c.Public, &c.Signature, &c.Attest, &c.AKPublic} {
		if len(*b) == 0 {
			*b = nil
		}
	}
	return c
}

// fill is n bytes of b.
func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// b64 is fill(n, b) in base64.
func b64(n int, b byte) string { return base64.StdEncoding.EncodeToString(fill(n, b)) }
