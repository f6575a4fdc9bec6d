package adminapi

import (
	"encoding/json"
	"time"
)

// SectionView is one section's state in a node's status.
type SectionView struct {
	Name       string     `json:"name"`
	State      string     `json:"state"`
	Generation uint64     `json:"generation"`
	Message    string     `json:"message,omitempty"`
	Changes    []string   `json:"changes,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
	Attempts   uint32     `json:"attempts,omitempty"`
}

// ConditionView is a condition of the machine, as the agent reported it.
type ConditionView struct {
	Type    string     `json:"type"`
	Subject string     `json:"subject,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Message string     `json:"message,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	Count   uint32     `json:"count,omitempty"`
}

// PressureView is the machine's pressure (PSI averages, CPU steal).
type PressureView struct {
	Available       bool       `json:"available"`
	CPUSomeAvg10    float64    `json:"cpu_some_avg10"`
	CPUSomeAvg60    float64    `json:"cpu_some_avg60"`
	MemorySomeAvg10 float64    `json:"memory_some_avg10"`
	MemoryFullAvg10 float64    `json:"memory_full_avg10"`
	IOSomeAvg10     float64    `json:"io_some_avg10"`
	IOFullAvg10     float64    `json:"io_full_avg10"`
	CPUStealPercent float64    `json:"cpu_steal_percent"`
	At              *time.Time `json:"at,omitempty"`
}

// StatusView is a node's status as the admin API and `bcgw status` show
// it: the gateway's view of the node, then its latest StatusReport.
type StatusView struct {
	Node      string    `json:"node"`
	Role      string    `json:"role"`
	Site      string    `json:"site"`
	Connected bool      `json:"connected"`
	Gateway   string    `json:"gateway,omitempty"` // the gateway holding its session (NodeView)
	LastSeen  time.Time `json:"last_seen,omitzero"`
	// SpecGeneration is the gateway's desired spec generation (0: none);
	// AppliedGeneration the one the agent holds, ObservedGeneration the
	// one its sections last converged or failed at (from its latest
	// Hello, Heartbeat or StatusReport).
	SpecGeneration     uint64 `json:"spec_generation"`
	AppliedGeneration  uint64 `json:"applied_generation"`
	ObservedGeneration uint64 `json:"observed_generation"`
	// RefusedGeneration and SpecError: the agent refused that generation
	// (its held spec is unchanged) and why.
	RefusedGeneration uint64            `json:"refused_generation,omitempty"`
	SpecError         string            `json:"spec_error,omitempty"`
	Sections          []SectionView     `json:"sections"`
	Conditions        []ConditionView   `json:"conditions"`
	Pressure          *PressureView     `json:"pressure,omitempty"`
	InventoryHashes   map[string]string `json:"inventory_hashes,omitempty"`
	InventoryHashesAt *time.Time        `json:"inventory_hashes_at,omitempty"`
	Inventory         json.RawMessage   `json:"inventory,omitempty"`
	// Report is the role's report sections (a site's "images" and
	// "site"); ReportAt when the latest StatusReport arrived.
	Report   json.RawMessage `json:"report,omitempty"`
	ReportAt *time.Time      `json:"report_at,omitempty"`
	// Upgrade is the node's latest daemon.upgrade (upgrades.go).
	Upgrade *UpgradeView `json:"upgrade,omitempty"`
}

// EventView is a stored event as the admin API shows it.
type EventView struct {
	Seq        uint64    `json:"seq"`
	Type       string    `json:"type"`
	At         time.Time `json:"at"`
	ReceivedAt time.Time `json:"received_at"`
	// Body is the event's JSON (a body that is not JSON is shown as a
	// JSON string); BodyDropped the size of a body too large to keep.
	Body        json.RawMessage `json:"body,omitempty"`
	BodyDropped int             `json:"body_dropped,omitempty"`
}
