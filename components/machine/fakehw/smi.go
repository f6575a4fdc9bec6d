package fakehw

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// NvidiaSMI returns a Runner that answers like nvidia-smi on the node made
// from seed: `-q -x`, `-L`, `--query-gpu=uuid,compute_cap`,
// `--query-gpu=driver_version`, `topo -m` and `nvlink -s`. Anything else
// fails as nvidia-smi does for a bad argument; `mig -lgip` lists the MIG
// GPUs' profiles, or fails as on a node without MIG.
func NvidiaSMI(seed int64) nvsmi.Runner {
	return func(ctx context.Context, args ...string) ([]byte, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		gpus := GPUs(seed)
		switch strings.Join(args, " ") {
		case "-q -x":
			return smiXML(gpus), nil
		case "-L":
			var b bytes.Buffer
			for _, g := range gpus {
				fmt.Fprintf(&b, "GPU %d: %s (UUID: %s)\n", g.Index, g.Name, g.UUID)
				for _, d := range g.MIG.Devices {
					fmt.Fprintf(&b, "  MIG %-13s Device %2d: (UUID: %s)\n", d.Profile, d.Index, d.UUID)
				}
			}
			return b.Bytes(), nil
		case "--query-gpu=uuid,compute_cap --format=csv,noheader":
			var b bytes.Buffer
			for _, g := range gpus {
				fmt.Fprintf(&b, "%s, %s\n", g.UUID, g.ComputeCap)
			}
			return b.Bytes(), nil
		case "--query-gpu=driver_version --format=csv,noheader":
			return []byte(strings.Repeat(DriverVersion+"\n", len(gpus))), nil
		case "topo -m":
			return topo(seed), nil
		case "nvlink -s":
			var b bytes.Buffer
			for _, g := range gpus {
				fmt.Fprintf(&b, "GPU %d: %s (UUID: %s)\n", g.Index, g.Name, g.UUID)
				for _, l := range g.NVLinks {
					fmt.Fprintf(&b, "\t Link %d: %s GB/s\n", l.Link, strconv.FormatFloat(l.SpeedGBps, 'f', -1, 64))
				}
			}
			return b.Bytes(), nil
		case "mig -lgip":
			return migProfiles(gpus)
		}
		return nil, fmt.Errorf("exit status 2: invalid combination of input arguments: %s", strings.Join(args, " "))
	}
}

// topo writes the `nvidia-smi topo -m` matrix of the node: GPUs all to all
// over 18 NVLinks, each next to its own ConnectX-7 NIC.
func topo(seed int64) []byte {
	ns := nics(seed)
	var cols []string
	for i := 0; i < GPUCount; i++ {
		cols = append(cols, fmt.Sprintf("GPU%d", i))
	}
	for i := range ns {
		cols = append(cols, fmt.Sprintf("NIC%d", i))
	}
	var b bytes.Buffer
	b.WriteString("\t" + strings.Join(cols, "\t") + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n")
	for i := 0; i < GPUCount; i++ {
		row := []string{fmt.Sprintf("GPU%d", i)}
		for j := 0; j < GPUCount; j++ {
			if j == i {
				row = append(row, " X ")
			} else {
				row = append(row, fmt.Sprintf("NV%d", NVLinksPerGPU))
			}
		}
		for _, n := range ns {
			row = append(row, pathTo(i, n))
		}
		cpus, numa := cpusSocket0, "0"
		if socketOf(i) == 1 {
			cpus, numa = cpusSocket1, "1"
		}
		row = append(row, cpus, numa, "", "N/A")
		b.WriteString(strings.Join(row, "\t") + "\n")
	}
	for a, na := range ns {
		row := []string{fmt.Sprintf("NIC%d", a)}
		for i := 0; i < GPUCount; i++ {
			row = append(row, pathTo(i, na))
		}
		for c, nc := range ns {
			switch {
			case c == a:
				row = append(row, " X ")
			case na.socket != nc.socket:
				row = append(row, "SYS")
			case na.PCIAddress[:10] == nc.PCIAddress[:10]:
				row = append(row, "PIX") // two ports of one card
			default:
				row = append(row, "NODE")
			}
		}
		row = append(row, "", "", "", "")
		b.WriteString(strings.Join(row, "\t") + "\n")
	}
	b.WriteString("\nLegend:\n\n  X    = Self\n" +
		"  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n" +
		"  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n" +
		"  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n" +
		"  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n" +
		"  PIX  = Connection traversing at most a single PCIe bridge\n" +
		"  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n")
	for i, n := range ns {
		fmt.Fprintf(&b, "  NIC%d: %s\n", i, n.RDMADevices[0])
	}
	b.WriteString("\n")
	return b.Bytes()
}

// smiXML writes `nvidia-smi -q -x` for gpus in the driver 550 schema
// (nvsmi_device_v12), with the elements nvsmi reads.
func smiXML(gpus []nvsmi.GPU) []byte {
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	na := func(s string) string {
		if s == "" {
			return "N/A"
		}
		return esc(s)
	}
	yesNo := func(v bool) string {
		if v {
			return "Yes"
		}
		return "No"
	}
	w := func(indent int, format string, args ...any) {
		b.WriteString(strings.Repeat("\t", indent))
		fmt.Fprintf(&b, format, args...)
		b.WriteString("\n")
	}
	f2 := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	smiBus := func(bus string) string { return "0000" + bus } // 00000000:18:00.0

	w(0, `<?xml version="1.0" ?>`)
	w(0, `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">`)
	w(0, "<nvidia_smi_log>")
	w(1, "<timestamp>Mon Jan  1 00:00:00 2024</timestamp>")
	w(1, "<driver_version>%s</driver_version>", esc(DriverVersion))
	w(1, "<cuda_version>%s</cuda_version>", esc(CUDAVersion))
	w(1, "<attached_gpus>%d</attached_gpus>", len(gpus))
	for _, g := range gpus {
		s := g.Sample
		w(1, `<gpu id="%s">`, strings.ToUpper(smiBus(g.PCIBusID)))
		w(2, "<product_name>%s</product_name>", esc(g.Name))
		w(2, "<product_brand>NVIDIA</product_brand>")
		w(2, "<product_architecture>%s</product_architecture>", na(g.Architecture))
		w(2, "<persistence_mode>%s</persistence_mode>", na(g.Persistence))
		w(2, "<mig_mode>")
		w(3, "<current_mig>%s</current_mig>", na(g.MIG.Current))
		w(3, "<pending_mig>%s</pending_mig>", na(g.MIG.Pending))
		w(2, "</mig_mode>")
		migXML(w, g)
		w(2, "<serial>%s</serial>", na(g.Serial))
		w(2, "<uuid>%s</uuid>", na(g.UUID))
		w(2, "<minor_number>%d</minor_number>", g.Index)
		w(2, "<vbios_version>%s</vbios_version>", na(g.VBIOS))
		w(2, "<board_part_number>%s</board_part_number>", na(g.BoardPart))
		w(2, "<pci>")
		w(3, "<pci_device_id>%s</pci_device_id>", na(g.PCIDeviceID))
		w(3, "<pci_bus_id>%s</pci_bus_id>", strings.ToUpper(smiBus(g.PCIBusID)))
		w(3, "<pci_gpu_link_info>")
		w(4, "<pcie_gen>")
		w(5, "<max_link_gen>%d</max_link_gen>", g.PCIe.GenMax)
		w(5, "<current_link_gen>%d</current_link_gen>", s.PCIeGenCurrent)
		w(4, "</pcie_gen>")
		w(4, "<link_widths>")
		w(5, "<max_link_width>%dx</max_link_width>", g.PCIe.WidthMax)
		w(5, "<current_link_width>%dx</current_link_width>", g.PCIe.WidthCurrent)
		w(4, "</link_widths>")
		w(3, "</pci_gpu_link_info>")
		w(2, "</pci>")
		w(2, "<performance_state>%s</performance_state>", na(s.PerformanceState))
		w(2, "<fb_memory_usage>")
		w(3, "<total>%d MiB</total>", g.MemoryTotalMiB)
		w(3, "<reserved>%d MiB</reserved>", g.MemoryTotalMiB-s.MemoryUsedMiB-s.MemoryFreeMiB)
		w(3, "<used>%d MiB</used>", s.MemoryUsedMiB)
		w(3, "<free>%d MiB</free>", s.MemoryFreeMiB)
		w(2, "</fb_memory_usage>")
		w(2, "<compute_mode>%s</compute_mode>", na(g.ComputeMode))
		w(2, "<utilization>")
		w(3, "<gpu_util>%s %%</gpu_util>", strconv.FormatFloat(s.UtilizationGPU, 'f', -1, 64))
		w(3, "<memory_util>%s %%</memory_util>", strconv.FormatFloat(s.UtilizationMemory, 'f', -1, 64))
		w(2, "</utilization>")
		w(2, "<ecc_mode>")
		w(3, "<current_ecc>%s</current_ecc>", na(g.ECC.Current))
		w(3, "<pending_ecc>%s</pending_ecc>", na(g.ECC.Pending))
		w(2, "</ecc_mode>")
		w(2, "<ecc_errors>")
		for _, scope := range []struct {
			tag string
			c   nvsmi.ECCCounts
		}{{"volatile", g.ECC.Volatile}, {"aggregate", g.ECC.Aggregate}} {
			count := func(n int64) string {
				if !scope.c.Supported {
					return "N/A"
				}
				return strconv.FormatInt(n, 10)
			}
			w(3, "<%s>", scope.tag)
			// Correctable errors are not split by memory in the record;
			// they are written as DRAM ones.
			w(4, "<sram_correctable>%s</sram_correctable>", count(0))
			w(4, "<sram_uncorrectable>%s</sram_uncorrectable>", count(scope.c.SRAMUncorrectable))
			w(4, "<dram_correctable>%s</dram_correctable>", count(scope.c.Correctable))
			w(4, "<dram_uncorrectable>%s</dram_uncorrectable>", count(scope.c.DRAMUncorrectable))
			w(3, "</%s>", scope.tag)
		}
		w(2, "</ecc_errors>")
		w(2, "<retired_pages>")
		if g.RetiredPages.Supported {
			w(3, "<multiple_single_bit_retirement><retired_count>%d</retired_count></multiple_single_bit_retirement>", g.RetiredPages.SingleBit)
			w(3, "<double_bit_retirement><retired_count>%d</retired_count></double_bit_retirement>", g.RetiredPages.DoubleBit)
			w(3, "<pending_retirement>%s</pending_retirement>", yesNo(g.RetiredPages.Pending))
		} else {
			w(3, "<multiple_single_bit_retirement><retired_count>N/A</retired_count></multiple_single_bit_retirement>")
			w(3, "<double_bit_retirement><retired_count>N/A</retired_count></double_bit_retirement>")
			w(3, "<pending_retirement>N/A</pending_retirement>")
		}
		w(2, "</retired_pages>")
		if rr := g.RowRemap; rr != nil {
			w(2, "<remapped_rows>")
			w(3, "<remapped_row_corr>%d</remapped_row_corr>", rr.Correctable)
			w(3, "<remapped_row_unc>%d</remapped_row_unc>", rr.Uncorrectable)
			w(3, "<remapped_row_pending>%s</remapped_row_pending>", yesNo(rr.Pending))
			w(3, "<remapped_row_failure>%s</remapped_row_failure>", yesNo(rr.Failure))
			w(2, "</remapped_rows>")
		} else {
			w(2, "<remapped_rows>N/A</remapped_rows>")
		}
		w(2, "<temperature>")
		w(3, "<gpu_temp>%s C</gpu_temp>", strconv.FormatFloat(s.TemperatureC, 'f', -1, 64))
		w(3, "<memory_temp>%s C</memory_temp>", strconv.FormatFloat(s.MemoryTempC, 'f', -1, 64))
		w(2, "</temperature>")
		w(2, "<gpu_power_readings>")
		w(3, "<power_state>%s</power_state>", na(s.PerformanceState))
		w(3, "<power_draw>%s W</power_draw>", f2(s.PowerDrawW))
		w(3, "<current_power_limit>%s W</current_power_limit>", f2(g.PowerLimitW))
		w(3, "<requested_power_limit>%s W</requested_power_limit>", f2(g.PowerLimitW))
		w(3, "<default_power_limit>%s W</default_power_limit>", f2(g.DefaultPowerLimitW))
		w(3, "<min_power_limit>200.00 W</min_power_limit>")
		w(3, "<max_power_limit>%s W</max_power_limit>", f2(g.MaxPowerLimitW))
		w(2, "</gpu_power_readings>")
		w(2, "<clocks>")
		w(3, "<graphics_clock>%s MHz</graphics_clock>", strconv.FormatFloat(s.ClockGraphicsMHz, 'f', -1, 64))
		w(3, "<sm_clock>%s MHz</sm_clock>", strconv.FormatFloat(s.ClockSMMHz, 'f', -1, 64))
		w(3, "<mem_clock>%s MHz</mem_clock>", strconv.FormatFloat(s.ClockMemoryMHz, 'f', -1, 64))
		w(2, "</clocks>")
		w(2, "<fabric>")
		w(3, "<state>%s</state>", na(g.Fabric.State))
		w(3, "<status>%s</status>", na(g.Fabric.Status))
		w(3, "<cliqueId>%s</cliqueId>", na(g.Fabric.CliqueID))
		w(3, "<clusterUuid>%s</clusterUuid>", na(g.Fabric.ClusterUUID))
		w(2, "</fabric>")
		w(2, "<processes>")
		for _, p := range s.Processes {
			w(3, "<process_info>")
			w(4, "<gpu_instance_id>%s</gpu_instance_id>", na(p.GPUInstanceID))
			w(4, "<compute_instance_id>%s</compute_instance_id>", na(p.ComputeInstanceID))
			w(4, "<pid>%d</pid>", p.PID)
			w(4, "<type>%s</type>", na(p.Type))
			w(4, "<process_name>%s</process_name>", na(p.Name))
			w(4, "<used_memory>%d MiB</used_memory>", p.UsedMemoryMiB)
			w(3, "</process_info>")
		}
		w(2, "</processes>")
		w(1, "</gpu>")
	}
	w(0, "</nvidia_smi_log>")
	return b.Bytes()
}
