package adminapi

import "encoding/json"

// SpecView is a node's desired spec as the admin API shows it.
type SpecView struct {
	Generation uint64          `json:"generation"`
	Spec       json.RawMessage `json:"spec"`
}

// GenerationView answers a spec change.
type GenerationView struct {
	Generation uint64 `json:"generation"`
}
