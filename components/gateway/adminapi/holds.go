package adminapi

// HoldRequest is one GPU hold as `bcgw hold` asks for it: the devices
// section's hold (docs/devices.md). The node checks it; bcgw only edits
// the node's spec.
type HoldRequest struct {
	Allocation string      `json:"allocation"`
	GPUs       []string    `json:"gpus"`
	Limits     *HoldLimits `json:"limits,omitempty"`
}

// HoldLimits are a hold's limits.
type HoldLimits struct {
	CPUs        string `json:"cpus,omitempty"`
	MemoryBytes uint64 `json:"memory_bytes,omitempty"`
	HugePages2M int64  `json:"hugepages_2m,omitempty"`
}
