// Package status is the agent's local status endpoint and `bcd status`.
//
// A running agent (node, site or ramdisk) serves a Snapshot of its state on
// a root-only unix socket (mode 0600 in a 0700 directory, socket_path in
// config.toml). The protocol is one request line, "status\n", answered by
// one line of JSON. Read is the client; Command is `bcd status`, which
// prints the snapshot as text or, with --json, as the JSON itself.
package status

import "time"

// Key holders, Snapshot.KeyHolder.
const (
	KeyInFile = "a file"
	KeyInTPM  = "in the TPM"
)

// Snapshot is what the agent reports about itself at one moment. The agent
// fills it; every list is sent as [] rather than null. Times are UTC and
// left out of the JSON while they are zero (no session yet, no mark).
type Snapshot struct {
	NodeID  string `json:"node_id"`
	Site    string `json:"site"`
	Role    string `json:"role"`
	BootID  string `json:"boot_id"`
	Version string `json:"version"`

	// Gateway is the configured gateway URL; Connected whether a session
	// is established now, since SessionSince with Epoch.
	Gateway      string    `json:"gateway"`
	Connected    bool      `json:"connected"`
	Epoch        uint64    `json:"epoch"`
	SessionSince time.Time `json:"session_since,omitzero"`

	// ClockOffsetMS is the working clock minus the local clock, in
	// milliseconds; TimeMark the highest gateway time accepted.
	ClockOffsetMS int64     `json:"clock_offset_ms"`
	TimeMark      time.Time `json:"time_mark,omitzero"`

	// Converge is the desired state: the generation held (applied), the
	// one every section last settled at (observed), each section's state.
	Converge Converge `json:"converge"`
	// SignedIntent is the held trust bundle and whether it makes signed
	// intent enforced.
	SignedIntent SignedIntent `json:"signed_intent"`

	Running  []Job  `json:"running"`
	Deferred []Job  `json:"deferred"`
	Lanes    []Lane `json:"lanes"`

	EventBacklog   int    `json:"event_backlog"`
	EventsDropped  uint64 `json:"events_dropped"`
	ResultsUnacked int    `json:"results_unacked"`

	CertificateNotAfter time.Time `json:"certificate_not_after,omitzero"`
	// CertificateValidFor is how long the certificate has left, as a Go
	// duration ("14h12m0s"), or "expired".
	CertificateValidFor string `json:"certificate_valid_for"`
	// KeyHolder is KeyInFile or KeyInTPM.
	KeyHolder string `json:"key_holder"`

	GPUs []GPU `json:"gpus"`

	// Conditions are what the node reports as conditions (Xid, the host
	// units' RebootRequired, FabricManagerDown, MPSDown).
	Conditions []Condition `json:"conditions,omitempty"`
	// HostUnits are the host section's units and their states (docs/host.md).
	HostUnits []HostUnit `json:"host_units,omitempty"`

	// Taps are the instances' taps with their network policy and its
	// state (docs/instances.md, "Network policy").
	Taps []Tap `json:"taps,omitempty"`

	// Instances are every domain the instance runtime lists (bcd's and
	// others') and the instances that failed; InstancesComplete is false
	// when the runtime could not list them (nil: no instances section).
	Instances         []Instance `json:"instances,omitempty"`
	InstancesComplete *bool      `json:"instances_complete,omitempty"`

	// Tunnels are the open tunnels (components/agent/tunnel).
	Tunnels []Tunnel `json:"tunnels"`

	// BootLease is a site agent's boot lease (nil on other roles).
	BootLease *BootLease `json:"boot_lease,omitempty"`

	// Telemetry is the telemetry section's exporter (nil without one).
	Telemetry *Telemetry `json:"telemetry,omitempty"`
}

// Telemetry is the OTLP exporter as bcd status shows it: the endpoint and
// interval, the last export that succeeded and the last error, the
// points delivered and dropped since the agent started, and the batches
// (and their bytes) waiting for the collector.
type Telemetry struct {
	Endpoint       string    `json:"endpoint"`
	Interval       string    `json:"interval"`
	LastExport     time.Time `json:"last_export,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastErrorAt    time.Time `json:"last_error_at,omitzero"`
	ExportedPoints uint64    `json:"exported_points"`
	DroppedPoints  uint64    `json:"dropped_points"`
	PendingBatches int       `json:"pending_batches"`
	PendingBytes   int       `json:"pending_bytes"`
}

// SignedIntent is the held trust bundle as bcd status shows it.
type SignedIntent struct {
	TrustBundleVersion uint64 `json:"trust_bundle_version"`
	Enforced           bool   `json:"enforced"`
	Roots              int    `json:"command_signing_roots"`
	// Approvers is the destructive-batch quorum in force (nil: none);
	// ApproversRefused why the last bundle's set was not taken.
	Approvers        *Approvers `json:"approvers,omitempty"`
	ApproversRefused string     `json:"approvers_refused,omitempty"`
}

// Approvers is an approver set as bcd status shows it.
type Approvers struct {
	Epoch     uint64 `json:"epoch"`
	Threshold int    `json:"threshold"`
	Keys      int    `json:"keys"`
}

// Converge is the desired state as bcd status shows it.
type Converge struct {
	Applied           uint64    `json:"applied_generation"`
	Observed          uint64    `json:"observed_generation"`
	SpecError         string    `json:"spec_error,omitempty"`
	RefusedGeneration uint64    `json:"refused_generation,omitempty"`
	Sections          []Section `json:"sections"`
}

// Section is one NodeSpec section's state.
type Section struct {
	Name       string    `json:"name"`
	State      string    `json:"state"`
	Generation uint64    `json:"generation"`
	Message    string    `json:"message,omitempty"`
	Changes    []string  `json:"changes,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Attempts   int       `json:"attempts,omitempty"`
}

// Condition is one reported condition.
type Condition struct {
	Type    string    `json:"type"`
	Subject string    `json:"subject,omitempty"`
	Message string    `json:"message,omitempty"`
	Since   time.Time `json:"since,omitzero"`
}

// HostUnit is one host unit's state after the last pass.
type HostUnit struct {
	Name    string   `json:"name"`
	State   string   `json:"state"`
	Message string   `json:"message,omitempty"`
	Changes []string `json:"changes,omitempty"`
}

// Tap is one instance NIC's tap: its policy (EGRESS, PRIVATE, NONE) and
// whether its rules are loaded (GUARDED), its instance's policy could
// not be expressed (FAILED) or the tables are not loaded (UNLOADED).
type Tap struct {
	Tap      string `json:"tap"`
	Instance string `json:"instance"`
	Policy   string `json:"policy"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
}

// Instance is one domain, or an instance that failed without one.
type Instance struct {
	ID    string `json:"id"`
	State string `json:"state,omitempty"`
	// Owned: bcd created it; a domain it did not create is only listed.
	Owned  bool   `json:"owned"`
	Failed string `json:"failed,omitempty"`
}

// BootLease is whether this site agent holds its site's boot lease.
type BootLease struct {
	Held     bool   `json:"held"`
	ValidFor string `json:"valid_for"`
}

// Job is a running or deferred command.
type Job struct {
	ID      string    `json:"id"`
	Kind    string    `json:"kind"`
	Lane    string    `json:"lane"`
	Started time.Time `json:"started,omitzero"`
}

// Lane is one dispatcher lane: its size and how many slots are free.
type Lane struct {
	Lane string `json:"lane"`
	Size int    `json:"size"`
	Free int    `json:"free"`
}

// GPU is one GPU as read at the moment of the snapshot.
type GPU struct {
	Index          int     `json:"index"`
	UUID           string  `json:"uuid"`
	Name           string  `json:"name"`
	UtilizationPct float64 `json:"utilization_pct"`
	TemperatureC   float64 `json:"temperature_c"`
	PowerW         float64 `json:"power_w"`
	PowerLimitW    float64 `json:"power_limit_w"`
	MemoryUsedMiB  int64   `json:"memory_used_mib"`
	MemoryTotalMiB int64   `json:"memory_total_mib"`
	// HeldBy is the allocation holding the GPU ("" when free).
	HeldBy string `json:"held_by,omitempty"`
	// Health is the verdict of the GPU health checks (the diag.nvml
	// checks): HealthOK, HealthWarn, or HealthUnhealthy when a check
	// failed; "" when the node did not judge its GPUs. Problems are the
	// reasons of the checks that did not pass, each with its action.
	Health   string   `json:"health,omitempty"`
	Problems []string `json:"problems,omitempty"`
}

// GPU health verdicts, GPU.Health.
const (
	HealthOK        = "ok"
	HealthWarn      = "warn"
	HealthUnhealthy = "UNHEALTHY"
)

// ValidFor formats how long a certificate ending at notAfter has left at
// now, for Snapshot.CertificateValidFor: rounded to the minute ("14h12m0s"),
// to the second under a minute, "expired" once it has passed and "" for a
// zero notAfter.
func ValidFor(notAfter, now time.Time) string {
	if notAfter.IsZero() {
		return ""
	}
	d := notAfter.Sub(now)
	switch {
	case d <= 0:
		return "expired"
	case d < time.Minute:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

// normalize makes nil lists empty so the JSON carries [], and the top
// level times UTC. It never writes into the lists, which the agent may share.
func (s *Snapshot) normalize() {
	if s.Running == nil {
		s.Running = []Job{}
	}
	if s.Deferred == nil {
		s.Deferred = []Job{}
	}
	if s.Lanes == nil {
		s.Lanes = []Lane{}
	}
	if s.GPUs == nil {
		s.GPUs = []GPU{}
	}
	for _, t := range []*time.Time{&s.SessionSince, &s.TimeMark, &s.CertificateNotAfter} {
		if !t.IsZero() {
			*t = t.UTC()
		}
	}
}

// Tunnel is one open tunnel.
type Tunnel struct {
	ID       string    `json:"id"`
	Kind     string    `json:"kind"`
	Instance string    `json:"instance,omitempty"`
	Account  string    `json:"account"`
	JTI      string    `json:"jti"`
	Opened   time.Time `json:"opened"`
	Expires  time.Time `json:"expires"`
	BytesIn  int64     `json:"bytes_in"`
	BytesOut int64     `json:"bytes_out"`
}
