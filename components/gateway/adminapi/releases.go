package adminapi

import "time"

// ReleasePath is where the gateway serves a published binary, by its
// SHA-256: a manifest's artifact URL https://<gateway>/releases/<sha256>
// is answered by this gateway (no client certificate needed: the bytes
// are checked against the signed manifest by whoever fetches them).
const ReleasePath = "/releases/"

// Published is what PublishRelease stored.
type Published struct {
	Version  string `json:"version"`
	Sequence uint64 `json:"sequence"`
	// Served are the artifacts this gateway serves (role/arch), and
	// Elsewhere the ones whose URLs point elsewhere.
	Served    []string `json:"served"`
	Elsewhere []string `json:"elsewhere,omitempty"`
	// Shared: the release is in the database, so every gateway sharing it
	// serves it (false on a bbolt gateway: only this one does).
	Shared bool `json:"shared"`
}

// ReleaseView is one published release in `bcgw release list`.
type ReleaseView struct {
	Version   string    `json:"version"`
	Sequence  uint64    `json:"sequence"`
	Expires   time.Time `json:"expires"`
	Expired   bool      `json:"expired"`
	Artifacts []string  `json:"artifacts"` // role/arch
}

// PublishRequest is the admin API's POST /v1/releases: a signed release
// document as bcrelease wrote it (its exact bytes) and the SHA-256 of
// each binary uploaded for it (PUT /v1/releases/uploads/<sha256>).
type PublishRequest struct {
	Doc       []byte   `json:"doc"`
	Artifacts []string `json:"artifacts,omitempty"`
}

// ReleaseDocView is GET /v1/releases/<version>: the document as published.
type ReleaseDocView struct {
	Doc []byte `json:"doc"`
}
