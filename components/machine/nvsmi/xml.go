package nvsmi

import (
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// maxOutput bounds what is read from one nvidia-smi run.
const maxOutput = 64 << 20

// The XML shapes below name only the elements read. The schema changes with
// the driver (nvsmi_device_v10 … v13 DTDs): elements that a driver does not
// write stay empty, and both spellings are listed where one was renamed.

type xmlLog struct {
	XMLName       xml.Name `xml:"nvidia_smi_log"`
	DriverVersion string   `xml:"driver_version"`
	CUDAVersion   string   `xml:"cuda_version"`
	GPUs          []xmlGPU `xml:"gpu"`
}

type xmlGPU struct {
	ID           string `xml:"id,attr"`
	ProductName  string `xml:"product_name"`
	Architecture string `xml:"product_architecture"`
	Persistence  string `xml:"persistence_mode"`
	MIGMode      struct {
		Current string `xml:"current_mig"`
		Pending string `xml:"pending_mig"`
	} `xml:"mig_mode"`
	MIGDevices struct {
		Devices []xmlMIGDevice `xml:"mig_device"`
	} `xml:"mig_devices"`
	Serial    string `xml:"serial"`
	UUID      string `xml:"uuid"`
	VBIOS     string `xml:"vbios_version"`
	BoardPart string `xml:"board_part_number"`
	PCI       struct {
		BusID    string `xml:"pci_bus_id"`
		DeviceID string `xml:"pci_device_id"`
		Link     struct {
			Gen struct {
				Max     string `xml:"max_link_gen"`
				Current string `xml:"current_link_gen"`
			} `xml:"pcie_gen"`
			Widths struct {
				Max     string `xml:"max_link_width"`
				Current string `xml:"current_link_width"`
			} `xml:"link_widths"`
		} `xml:"pci_gpu_link_info"`
	} `xml:"pci"`
	PerformanceState string    `xml:"performance_state"`
	FBMemory         xmlMemory `xml:"fb_memory_usage"`
	ComputeMode      string    `xml:"compute_mode"`
	Utilization      struct {
		GPU    string `xml:"gpu_util"`
		Memory string `xml:"memory_util"`
	} `xml:"utilization"`
	ECCMode struct {
		Current string `xml:"current_ecc"`
		Pending string `xml:"pending_ecc"`
	} `xml:"ecc_mode"`
	ECCErrors    xmlECCErrors `xml:"ecc_errors"`
	RetiredPages struct {
		SingleBit struct {
			Count string `xml:"retired_count"`
		} `xml:"multiple_single_bit_retirement"`
		DoubleBit struct {
			Count string `xml:"retired_count"`
		} `xml:"double_bit_retirement"`
		// Drivers wrote <pending_blacklist> before they wrote
		// <pending_retirement>; many write both.
		Pending    string `xml:"pending_retirement"`
		PendingOld string `xml:"pending_blacklist"`
	} `xml:"retired_pages"`
	RecoveryAction string `xml:"gpu_recovery_action"`
	RemappedRows   struct {
		Corr    string `xml:"remapped_row_corr"`
		Unc     string `xml:"remapped_row_unc"`
		Pending string `xml:"remapped_row_pending"`
		Failure string `xml:"remapped_row_failure"`
	} `xml:"remapped_rows"`
	Temperature struct {
		GPU    string `xml:"gpu_temp"`
		Memory string `xml:"memory_temp"`
	} `xml:"temperature"`
	PowerReadings    xmlPower  `xml:"power_readings"`     // up to driver 530
	GPUPowerReadings xmlPower  `xml:"gpu_power_readings"` // 535 and later
	Clocks           xmlClocks `xml:"clocks"`
	Fabric           struct {
		State       string `xml:"state"`
		Status      string `xml:"status"`
		CliqueID    string `xml:"cliqueId"`
		ClusterUUID string `xml:"clusterUuid"`
	} `xml:"fabric"`
	Processes struct {
		List []xmlProcess `xml:"process_info"`
	} `xml:"processes"`
}

type xmlMIGDevice struct {
	Index             string `xml:"index"`
	GPUInstanceID     string `xml:"gpu_instance_id"`
	ComputeInstanceID string `xml:"compute_instance_id"`
	Attributes        struct {
		Shared struct {
			Multiprocessors string `xml:"multiprocessor_count"`
		} `xml:"shared"`
	} `xml:"device_attributes"`
	FBMemory xmlMemory `xml:"fb_memory_usage"`
}

type xmlMemory struct {
	Total string `xml:"total"`
	Used  string `xml:"used"`
	Free  string `xml:"free"`
}

// xmlECC holds both generations of ECC counters: <single_bit>/<double_bit>
// with a breakdown per memory (before Ampere), and the SRAM/DRAM counters
// of later drivers, whose SRAM uncorrectable count is split into parity and
// SEC-DED since driver 570.
type xmlECC struct {
	SingleBit         *xmlECCBits `xml:"single_bit"`
	DoubleBit         *xmlECCBits `xml:"double_bit"`
	SRAMCorrectable   string      `xml:"sram_correctable"`
	SRAMUncorrectable string      `xml:"sram_uncorrectable"`
	SRAMUncParity     string      `xml:"sram_uncorrectable_parity"`
	SRAMUncSECDED     string      `xml:"sram_uncorrectable_secded"`
	DRAMCorrectable   string      `xml:"dram_correctable"`
	DRAMUncorrectable string      `xml:"dram_uncorrectable"`
}

// xmlECCErrors is <ecc_errors>: the counters, and since driver 575 the
// repair state the driver keeps beside them.
type xmlECCErrors struct {
	Volatile           xmlECC `xml:"volatile"`
	Aggregate          xmlECC `xml:"aggregate"`
	ChannelRepair      string `xml:"channel_repair_pending"`
	TPCRepair          string `xml:"tpc_repair_pending"`
	UnrepairableMemory string `xml:"unrepairable_memory"`
}

type xmlECCBits struct {
	DeviceMemory string `xml:"device_memory"`
	DRAM         string `xml:"dram"`
	Total        string `xml:"total"`
}

type xmlPower struct {
	PowerDraw          string `xml:"power_draw"`
	InstantPowerDraw   string `xml:"instant_power_draw"`
	AveragePowerDraw   string `xml:"average_power_draw"`
	PowerLimit         string `xml:"power_limit"`
	CurrentPowerLimit  string `xml:"current_power_limit"`
	EnforcedPowerLimit string `xml:"enforced_power_limit"`
	DefaultPowerLimit  string `xml:"default_power_limit"`
	MaxPowerLimit      string `xml:"max_power_limit"`
}

type xmlClocks struct {
	Graphics string `xml:"graphics_clock"`
	SM       string `xml:"sm_clock"`
	Memory   string `xml:"mem_clock"`
}

type xmlProcess struct {
	GPUInstanceID     string `xml:"gpu_instance_id"`
	ComputeInstanceID string `xml:"compute_instance_id"`
	PID               string `xml:"pid"`
	Type              string `xml:"type"`
	Name              string `xml:"process_name"`
	UsedMemory        string `xml:"used_memory"`
}

// ParseXML reads the output of `nvidia-smi -q -x` into one record per GPU,
// in nvidia-smi's index order. It reads the schemas of drivers from the 270
// series to the 590 series; elements a driver does not write are left empty.
func ParseXML(r io.Reader) ([]GPU, error) {
	d := xml.NewDecoder(io.LimitReader(r, maxOutput))
	d.CharsetReader = func(_ string, in io.Reader) (io.Reader, error) { return in, nil }
	var log xmlLog
	if err := d.Decode(&log); err != nil {
		return nil, fmt.Errorf("decode nvidia-smi XML: %w", err)
	}
	gpus := make([]GPU, 0, len(log.GPUs))
	for i, x := range log.GPUs {
		gpus = append(gpus, fromXML(i, &log, &x))
	}
	return gpus, nil
}

func fromXML(index int, log *xmlLog, x *xmlGPU) GPU {
	var g GPU
	g.Index = index
	g.UUID = value(x.UUID)
	g.Name = value(x.ProductName)
	g.Architecture = value(x.Architecture)
	bus := value(x.PCI.BusID)
	if bus == "" {
		bus = value(x.ID)
	}
	g.PCIBusID = NormalizeBusID(bus)
	g.PCIDeviceID = value(x.PCI.DeviceID)
	g.Serial = value(x.Serial)
	g.VBIOS = value(x.VBIOS)
	g.BoardPart = value(x.BoardPart)
	g.DriverVersion = value(log.DriverVersion)
	g.CUDAVersion = value(log.CUDAVersion)
	g.MIG.Current = value(x.MIGMode.Current)
	g.MIG.Pending = value(x.MIGMode.Pending)
	for _, m := range x.MIGDevices.Devices {
		g.MIG.Devices = append(g.MIG.Devices, MIGDevice{
			Index:             int(num(m.Index)),
			GPUInstanceID:     int(num(m.GPUInstanceID)),
			ComputeInstanceID: int(num(m.ComputeInstanceID)),
			Multiprocessors:   int(num(m.Attributes.Shared.Multiprocessors)),
			MemoryTotalMiB:    int64(num(m.FBMemory.Total)),
		})
	}
	sort.Slice(g.MIG.Devices, func(i, j int) bool { return g.MIG.Devices[i].Index < g.MIG.Devices[j].Index })
	g.Persistence = value(x.Persistence)
	g.ComputeMode = value(x.ComputeMode)

	p := x.GPUPowerReadings
	if isZeroPower(p) {
		p = x.PowerReadings
	}
	g.PowerLimitW = num(first(p.CurrentPowerLimit, p.EnforcedPowerLimit, p.PowerLimit))
	g.DefaultPowerLimitW = num(p.DefaultPowerLimit)
	g.MaxPowerLimitW = num(p.MaxPowerLimit)
	g.MemoryTotalMiB = int64(num(x.FBMemory.Total))

	g.ECC.Current = value(x.ECCMode.Current)
	g.ECC.Pending = value(x.ECCMode.Pending)
	g.ECC.Volatile = eccCounts(&x.ECCErrors.Volatile)
	g.ECC.Aggregate = eccCounts(&x.ECCErrors.Aggregate)

	if c, ok := count(x.RetiredPages.SingleBit.Count); ok {
		g.RetiredPages.Supported = true
		g.RetiredPages.SingleBit = c
	}
	if c, ok := count(x.RetiredPages.DoubleBit.Count); ok {
		g.RetiredPages.Supported = true
		g.RetiredPages.DoubleBit = c
	}
	g.RetiredPages.Pending = yes(x.RetiredPages.Pending) || yes(x.RetiredPages.PendingOld)
	if value(x.RetiredPages.Pending) != "" || value(x.RetiredPages.PendingOld) != "" {
		g.RetiredPages.Supported = true
	}
	g.RecoveryAction = value(x.RecoveryAction)
	g.Repair = Repair{
		ChannelPending:     yes(x.ECCErrors.ChannelRepair),
		TPCPending:         yes(x.ECCErrors.TPCRepair),
		UnrepairableMemory: yes(x.ECCErrors.UnrepairableMemory),
	}

	rr := x.RemappedRows
	if value(rr.Pending) != "" || value(rr.Failure) != "" {
		g.RowRemap = &RowRemap{
			Correctable:   int64(num(rr.Corr)),
			Uncorrectable: int64(num(rr.Unc)),
			Pending:       yes(rr.Pending),
			Failure:       yes(rr.Failure),
		}
	}

	g.PCIe.GenMax = int(num(x.PCI.Link.Gen.Max))
	g.PCIe.WidthMax = int(num(x.PCI.Link.Widths.Max))
	g.PCIe.WidthCurrent = int(num(x.PCI.Link.Widths.Current))

	g.Fabric = Fabric{
		State:       value(x.Fabric.State),
		Status:      value(x.Fabric.Status),
		CliqueID:    value(x.Fabric.CliqueID),
		ClusterUUID: value(x.Fabric.ClusterUUID),
	}

	s := &g.Sample
	s.PerformanceState = value(x.PerformanceState)
	s.TemperatureC = num(x.Temperature.GPU)
	s.MemoryTempC = num(x.Temperature.Memory)
	s.PowerDrawW = num(first(p.InstantPowerDraw, p.PowerDraw, p.AveragePowerDraw))
	s.UtilizationGPU = num(x.Utilization.GPU)
	s.UtilizationMemory = num(x.Utilization.Memory)
	s.MemoryUsedMiB = int64(num(x.FBMemory.Used))
	s.MemoryFreeMiB = int64(num(x.FBMemory.Free))
	s.ClockGraphicsMHz = num(x.Clocks.Graphics)
	s.ClockSMMHz = num(x.Clocks.SM)
	s.ClockMemoryMHz = num(x.Clocks.Memory)
	s.PCIeGenCurrent = int(num(x.PCI.Link.Gen.Current))
	for _, pr := range x.Processes.List {
		s.Processes = append(s.Processes, Process{
			PID:               int(num(pr.PID)),
			Type:              value(pr.Type),
			Name:              value(pr.Name),
			UsedMemoryMiB:     int64(num(pr.UsedMemory)),
			GPUInstanceID:     value(pr.GPUInstanceID),
			ComputeInstanceID: value(pr.ComputeInstanceID),
		})
	}
	sort.SliceStable(s.Processes, func(i, j int) bool { return s.Processes[i].PID < s.Processes[j].PID })
	return g
}

func eccCounts(x *xmlECC) ECCCounts {
	var c ECCCounts
	add := func(dst *int64, s string) {
		if n, ok := count(s); ok {
			*dst += n
			c.Supported = true
		}
	}
	if x.SingleBit != nil || x.DoubleBit != nil {
		if x.SingleBit != nil {
			add(&c.Correctable, x.SingleBit.Total)
		}
		if x.DoubleBit != nil {
			add(&c.Uncorrectable, x.DoubleBit.Total)
			// Device memory is the DRAM (called <dram> by a few drivers);
			// every other memory in the breakdown is on-chip SRAM.
			dram, ok := count(first(x.DoubleBit.DeviceMemory, x.DoubleBit.DRAM))
			if ok {
				c.DRAMUncorrectable = dram
				if c.Uncorrectable >= dram {
					c.SRAMUncorrectable = c.Uncorrectable - dram
				}
			}
		}
		return c
	}
	add(&c.Correctable, x.SRAMCorrectable)
	add(&c.Correctable, x.DRAMCorrectable)
	add(&c.SRAMUncorrectable, x.SRAMUncorrectable)
	add(&c.SRAMUncorrectable, x.SRAMUncParity)
	add(&c.SRAMUncorrectable, x.SRAMUncSECDED)
	add(&c.DRAMUncorrectable, x.DRAMUncorrectable)
	c.Uncorrectable = c.SRAMUncorrectable + c.DRAMUncorrectable
	return c
}

func isZeroPower(p xmlPower) bool {
	return p == xmlPower{}
}

// absentWords are what nvidia-smi prints, across drivers, where a field has
// no value: the field does not apply (N/A, None), the GPU or driver does
// not support it, NVML failed to read it, or the caller may not. Compared
// without regard to case, with any brackets around them removed.
var absentWords = []string{
	"n/a", "na", "none", "not found", "not supported", "unknown error", "unknown",
	"insufficient permissions", "no permission", "not available", "gpu is lost",
	"gpu requires reset", "requested functionality has been deprecated",
}

// Value trims a value nvidia-smi printed and maps its words for "no value"
// (N/A, [N/A], Not Found, [Not Supported], Unknown Error, Requested
// functionality has been deprecated, …) to "", so no record, inventory
// section or check ever carries them as a string.
func Value(s string) string { return value(s) }

func value(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	inner := s
	if strings.HasPrefix(inner, "[") && strings.HasSuffix(inner, "]") {
		// "[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient
		// Permissions]": nvidia-smi brackets every value it could not read.
		return ""
	}
	inner = strings.ToLower(inner)
	for _, w := range absentWords {
		if inner == w || (len(w) > 12 && strings.HasPrefix(inner, w)) {
			return ""
		}
	}
	return s
}

// first returns the first argument that has a value.
func first(vals ...string) string {
	for _, v := range vals {
		if value(v) != "" {
			return v
		}
	}
	return ""
}

// num reads the leading number of a value such as "81920 MiB", "16x",
// "67.03 W" or "27 C"; anything else is 0.
func num(s string) float64 {
	f, _ := number(s)
	return f
}

func number(s string) (float64, bool) {
	s = value(s)
	if s == "" {
		return 0, false
	}
	end := 0
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' || (end == 0 && (s[end] == '-' || s[end] == '+'))) {
		end++
	}
	f, err := strconv.ParseFloat(s[:end], 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e15 {
		return 0, false
	}
	return f, true
}

// count reads a non-negative counter; ok is false for N/A.
func count(s string) (int64, bool) {
	f, ok := number(s)
	if !ok || f < 0 {
		return 0, false
	}
	return int64(f), true
}

func yes(s string) bool {
	return strings.EqualFold(value(s), "yes")
}
