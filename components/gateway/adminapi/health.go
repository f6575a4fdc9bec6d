package adminapi

import "time"

// ReadyPath is the readiness check on the agents' port: 200 while the
// database answers, 503 when it does not. It names no error (the port is
// public); `bcgw health` does.
const ReadyPath = "/readyz"

// DatabaseHealth is whether the gateway's database answers.
type DatabaseHealth struct {
	Backend   string    `json:"backend"` // "bbolt" or "postgresql"
	Reachable bool      `json:"reachable"`
	Since     time.Time `json:"since"` // when it last changed
	Checked   time.Time `json:"checked"`
	Error     string    `json:"error,omitempty"`
}

// HealthView is `bcgw health`: this gateway, its database and sessions.
type HealthView struct {
	ServerName string         `json:"server_name"`
	Version    string         `json:"version"`
	Sessions   int            `json:"sessions"`
	Database   DatabaseHealth `json:"database"`
}
