package nvsmi

// GPU is one physical GPU as nvidia-smi reports it: what it is and how it is
// set up (Info, which belongs in the inventory and its hash) and what it is
// doing right now (Sample, which changes from one call to the next and never
// enters a hash).
type GPU struct {
	Info
	Sample Sample `json:"sample"`
}

// Info is the part of a GPU record that stays the same until someone changes
// the GPU's configuration or the hardware reports a fault. Fields nvidia-smi
// reports as N/A are left at their zero value.
type Info struct {
	// Index is nvidia-smi's index: the GPU's position in `nvidia-smi -q -x`.
	Index         int    `json:"index"`
	UUID          string `json:"uuid"`
	Name          string `json:"name"`
	Architecture  string `json:"architecture,omitempty"`
	PCIBusID      string `json:"pci_bus_id"` // normalized, see NormalizeBusID
	PCIDeviceID   string `json:"pci_device_id,omitempty"`
	Serial        string `json:"serial,omitempty"`
	VBIOS         string `json:"vbios,omitempty"`
	BoardPart     string `json:"board_part_number,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	CUDAVersion   string `json:"cuda_version,omitempty"`
	ComputeCap    string `json:"compute_cap,omitempty"`

	MIG         MIG    `json:"mig"`
	Persistence string `json:"persistence_mode,omitempty"` // Enabled or Disabled
	ComputeMode string `json:"compute_mode,omitempty"`     // Default, Exclusive_Process, Prohibited

	// PowerLimitW is the enforced power limit; Default and Max bound it.
	PowerLimitW        float64 `json:"power_limit_w,omitempty"`
	DefaultPowerLimitW float64 `json:"default_power_limit_w,omitempty"`
	MaxPowerLimitW     float64 `json:"max_power_limit_w,omitempty"`

	MemoryTotalMiB int64 `json:"memory_total_mib,omitempty"`

	ECC          ECC          `json:"ecc"`
	RetiredPages RetiredPages `json:"retired_pages"`
	// RowRemap is nil on GPUs without a row remapper (before Ampere) and
	// where nvidia-smi reports N/A, as in a VM or in MIG mode on some drivers.
	RowRemap *RowRemap `json:"row_remap,omitempty"`
	PCIe     PCIe      `json:"pcie"`
	Fabric   Fabric    `json:"fabric"`

	// RecoveryAction is what the driver (550 and later) says the GPU
	// needs: Reset, Reboot, Drain P2P or Drain and Reset; empty for None
	// and where the driver does not say.
	RecoveryAction string `json:"recovery_action,omitempty"`
	// Repair is the state of the GPU's own repairs (drivers 575 and later).
	Repair Repair `json:"repair"`

	NVLinks      []NVLink   `json:"nvlinks,omitempty"`
	Topology     []TopoLink `json:"topology,omitempty"`
	CPUAffinity  string     `json:"cpu_affinity,omitempty"`
	NUMAAffinity string     `json:"numa_affinity,omitempty"`
}

// MIG is a GPU's Multi-Instance GPU state.
type MIG struct {
	Current  string       `json:"current,omitempty"` // Enabled, Disabled or empty when unsupported
	Pending  string       `json:"pending,omitempty"`
	Devices  []MIGDevice  `json:"devices,omitempty"`
	Profiles []MIGProfile `json:"profiles,omitempty"`
}

// MIGDevice is one MIG instance from `-q -x`, completed by `-L`.
type MIGDevice struct {
	Index             int    `json:"index"`
	UUID              string `json:"uuid,omitempty"`
	Profile           string `json:"profile,omitempty"` // 1g.10gb
	GPUInstanceID     int    `json:"gpu_instance_id"`
	ComputeInstanceID int    `json:"compute_instance_id"`
	Multiprocessors   int    `json:"multiprocessors,omitempty"`
	MemoryTotalMiB    int64  `json:"memory_total_mib,omitempty"`
}

// MIGProfile is one GPU instance profile from `nvidia-smi mig -lgip`.
type MIGProfile struct {
	GPU       int     `json:"gpu"`
	Name      string  `json:"name"` // 1g.10gb
	ID        int     `json:"id"`
	Free      int     `json:"free"`
	Total     int     `json:"total"`
	MemoryGiB float64 `json:"memory_gib"`
}

// ECC is the ECC mode and error counters. Volatile counters count since the
// driver loaded, aggregate ones over the GPU's life.
type ECC struct {
	Current   string    `json:"current,omitempty"` // Enabled, Disabled
	Pending   string    `json:"pending,omitempty"`
	Volatile  ECCCounts `json:"volatile"`
	Aggregate ECCCounts `json:"aggregate"`
}

// ECCCounts are error totals in one scope. Older drivers report single-bit
// and double-bit errors per memory (device memory is the DRAM, the rest
// on-chip SRAM); newer ones report SRAM and DRAM counts directly. Both are
// normalized here.
type ECCCounts struct {
	Supported         bool  `json:"supported"`
	Correctable       int64 `json:"correctable"`
	Uncorrectable     int64 `json:"uncorrectable"`
	DRAMUncorrectable int64 `json:"dram_uncorrectable"`
	SRAMUncorrectable int64 `json:"sram_uncorrectable"`
}

// RetiredPages is the page retirement state of GPUs before Ampere.
type RetiredPages struct {
	Supported bool  `json:"supported"`
	SingleBit int64 `json:"single_bit"`
	DoubleBit int64 `json:"double_bit"`
	Pending   bool  `json:"pending"`
}

// Repair is what newer drivers report of the GPU's in-field repairs: a
// channel or TPC repair that waits for a reset, and memory the GPU can no
// longer repair.
type Repair struct {
	ChannelPending     bool `json:"channel_repair_pending,omitempty"`
	TPCPending         bool `json:"tpc_repair_pending,omitempty"`
	UnrepairableMemory bool `json:"unrepairable_memory,omitempty"`
}

// RowRemap is the row remapper state of Ampere and later GPUs.
type RowRemap struct {
	Correctable   int64 `json:"correctable"`
	Uncorrectable int64 `json:"uncorrectable"`
	Pending       bool  `json:"pending"` // a remap waits for a GPU reset
	Failure       bool  `json:"failure"` // a remap failed: no spare rows left
}

// PCIe is the GPU's PCIe link. The current generation is a sample (it drops
// when the GPU idles); the current width stays. GenMax and WidthMax are
// what the GPU supports, which the slot may not: many servers and cloud
// instances wire a x16 GPU at x8. The Slot fields come from sysfs, not
// nvidia-smi (see package pcielink): what the port upstream of the GPU
// supports, and the width first seen this boot; zero when unknown.
type PCIe struct {
	GenMax       int `json:"gen_max,omitempty"`
	WidthMax     int `json:"width_max,omitempty"`
	WidthCurrent int `json:"width_current,omitempty"`

	SlotWidthMax int `json:"slot_width_max,omitempty"`
	SlotGenMax   int `json:"slot_gen_max,omitempty"`
	FirstWidth   int `json:"first_width_this_boot,omitempty"`
}

// Fabric is the NVLink fabric state of NVSwitch systems.
type Fabric struct {
	State       string `json:"state,omitempty"`
	Status      string `json:"status,omitempty"`
	CliqueID    string `json:"clique_id,omitempty"`
	ClusterUUID string `json:"cluster_uuid,omitempty"`
}

// NVLink is one NVLink of a GPU from `nvidia-smi nvlink -s`.
type NVLink struct {
	Link      int     `json:"link"`
	Active    bool    `json:"active"`
	SpeedGBps float64 `json:"speed_gbps,omitempty"`
}

// TopoLink is one cell of `nvidia-smi topo -m`: how this GPU reaches Peer
// (another GPU's UUID, or a NIC's RDMA device name) — NV18, PIX, SYS, ...
type TopoLink struct {
	Peer string `json:"peer"`
	Link string `json:"link"`
}

// Sample is what a GPU is doing at the moment nvidia-smi ran.
type Sample struct {
	PerformanceState  string    `json:"performance_state,omitempty"`
	TemperatureC      float64   `json:"temperature_c"`
	MemoryTempC       float64   `json:"memory_temperature_c,omitempty"`
	PowerDrawW        float64   `json:"power_draw_w"`
	UtilizationGPU    float64   `json:"utilization_gpu_pct"`
	UtilizationMemory float64   `json:"utilization_memory_pct"`
	MemoryUsedMiB     int64     `json:"memory_used_mib"`
	MemoryFreeMiB     int64     `json:"memory_free_mib"`
	ClockGraphicsMHz  float64   `json:"clock_graphics_mhz"`
	ClockSMMHz        float64   `json:"clock_sm_mhz"`
	ClockMemoryMHz    float64   `json:"clock_memory_mhz"`
	PCIeGenCurrent    int       `json:"pcie_gen_current,omitempty"`
	Processes         []Process `json:"processes,omitempty"`
}

// Process is one process using a GPU.
type Process struct {
	PID               int    `json:"pid"`
	Type              string `json:"type"` // C, G or C+G
	Name              string `json:"name"`
	UsedMemoryMiB     int64  `json:"used_memory_mib"`
	GPUInstanceID     string `json:"gpu_instance_id,omitempty"`
	ComputeInstanceID string `json:"compute_instance_id,omitempty"`
}
