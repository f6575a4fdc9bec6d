package wire

import "encoding/json"

// jsonOf encodes r without Check, as a sender might.
func jsonOf(r *Request) ([]byte, error) { return json.Marshal(r) }

// normal makes an empty Data and a nil Data the same.
func normal(r *Request) Request {
	c := *r
	if len(c.Data) == 0 {
		c.Data = nil
	}
	return c
}
