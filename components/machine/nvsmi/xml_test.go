package nvsmi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func open(t testing.TB, name string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func parseFile(t *testing.T, name string) []GPU {
	t.Helper()
	gpus, err := ParseXML(open(t, name))
	if err != nil {
		t.Fatalf("ParseXML(%s): %v", name, err)
	}
	return gpus
}

func diff(t *testing.T, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		t.Errorf("got\n%s\nwant\n%s", g, w)
	}
}

// TestParseXMLCaptures checks every field read from real `nvidia-smi -q -x`
// captures of four driver generations (see testdata/README.md) against the
// values in the files.
func TestParseXMLCaptures(t *testing.T) {
	tests := []struct {
		file string
		want GPU
	}{
		{
			// Pascal, driver 510: <single_bit>/<double_bit> ECC counters,
			// retired pages, no row remapper, <power_readings>.
			file: "tesla-p100-pcie-16gb.510.47.03.xml",
			want: GPU{
				Info: Info{
					Index: 0, UUID: "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e", Name: "Tesla P100-PCIE-16GB",
					Architecture: "Pascal", PCIBusID: "0000:00:04.0", PCIDeviceID: "15F810DE",
					Serial: "0324217145110", VBIOS: "86.00.52.00.02",
					DriverVersion: "510.47.03", CUDAVersion: "11.6",
					Persistence: "Disabled", ComputeMode: "Default",
					PowerLimitW: 250, DefaultPowerLimitW: 250, MaxPowerLimitW: 250,
					MemoryTotalMiB: 16384,
					ECC: ECC{
						Current: "Enabled", Pending: "Enabled",
						Volatile:  ECCCounts{Supported: true},
						Aggregate: ECCCounts{Supported: true, Correctable: 3},
					},
					RetiredPages: RetiredPages{Supported: true},
					PCIe:         PCIe{GenMax: 3, WidthMax: 16, WidthCurrent: 16},
				},
				Sample: Sample{
					PerformanceState: "P0", TemperatureC: 38, PowerDrawW: 26.16,
					MemoryUsedMiB: 0, MemoryFreeMiB: 16280,
					ClockGraphicsMHz: 405, ClockSMMHz: 405, ClockMemoryMHz: 715, PCIeGenCurrent: 3,
				},
			},
		},
		{
			// Ampere in MIG mode, driver 510 (a cloud VM: no row remapper
			// data, volatile ECC counters N/A).
			file: "a100-sxm4-40gb-mig.510.47.03.xml",
			want: GPU{
				Info: Info{
					UUID: "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a", Name: "NVIDIA A100-SXM4-40GB",
					Architecture: "Ampere", PCIBusID: "0000:00:04.0", PCIDeviceID: "20B010DE",
					Serial: "1324321002473", VBIOS: "92.00.45.00.03",
					DriverVersion: "510.47.03", CUDAVersion: "11.6",
					MIG: MIG{Current: "Enabled", Pending: "Enabled", Devices: []MIGDevice{
						{Index: 0, GPUInstanceID: 1, ComputeInstanceID: 0, Multiprocessors: 42, MemoryTotalMiB: 19968},
						{Index: 1, GPUInstanceID: 2, ComputeInstanceID: 0, Multiprocessors: 42, MemoryTotalMiB: 19968},
					}},
					Persistence: "Disabled", ComputeMode: "Default",
					PowerLimitW: 400, DefaultPowerLimitW: 400, MaxPowerLimitW: 400,
					MemoryTotalMiB: 40960,
					ECC: ECC{
						Current: "Enabled", Pending: "Enabled",
						Aggregate: ECCCounts{Supported: true},
					},
					PCIe: PCIe{GenMax: 4, WidthMax: 16, WidthCurrent: 16},
				},
				Sample: Sample{
					PerformanceState: "P0", TemperatureC: 36, MemoryTempC: 44, PowerDrawW: 66.92,
					MemoryUsedMiB: 38, MemoryFreeMiB: 40315,
					ClockGraphicsMHz: 1410, ClockSMMHz: 1410, ClockMemoryMHz: 1215, PCIeGenCurrent: 4,
				},
			},
		},
		{
			// Ampere, driver 535: <gpu_power_readings>, SRAM/DRAM counters,
			// four MIG devices.
			file: "a100-sxm4-80gb-mig.535.54.03.xml",
			want: GPU{
				Info: Info{
					UUID: "GPU-513536b6-7d19-9063-b049-1e69664bb298", Name: "NVIDIA A100-SXM4-80GB",
					Architecture: "Ampere", PCIBusID: "0000:01:00.0", PCIDeviceID: "20B210DE",
					Serial: "1650522003820", VBIOS: "92.00.36.00.02", BoardPart: "692-2G506-0212-002",
					DriverVersion: "535.54.03", CUDAVersion: "12.2",
					MIG: MIG{Current: "Enabled", Pending: "Enabled", Devices: []MIGDevice{
						{Index: 0, GPUInstanceID: 3, Multiprocessors: 14, MemoryTotalMiB: 19968},
						{Index: 1, GPUInstanceID: 4, Multiprocessors: 14, MemoryTotalMiB: 19968},
						{Index: 2, GPUInstanceID: 5, Multiprocessors: 14, MemoryTotalMiB: 19968},
						{Index: 3, GPUInstanceID: 6, Multiprocessors: 14, MemoryTotalMiB: 19968},
					}},
					Persistence: "Disabled", ComputeMode: "Default",
					PowerLimitW: 500, DefaultPowerLimitW: 500, MaxPowerLimitW: 500,
					MemoryTotalMiB: 81920,
					ECC: ECC{
						Current: "Enabled", Pending: "Enabled",
						Volatile:  ECCCounts{Supported: true},
						Aggregate: ECCCounts{Supported: true},
					},
					PCIe: PCIe{GenMax: 4, WidthMax: 16, WidthCurrent: 16},
				},
				Sample: Sample{
					PerformanceState: "P0", TemperatureC: 27, MemoryTempC: 44, PowerDrawW: 67.03,
					MemoryUsedMiB: 50, MemoryFreeMiB: 80999,
					ClockGraphicsMHz: 1275, ClockSMMHz: 1275, ClockMemoryMHz: 1593, PCIeGenCurrent: 4,
				},
			},
		},
		{
			// Ada, driver 535: a row remapper, ECC disabled.
			file: "rtx-4090.535.86.05.xml",
			want: GPU{
				Info: Info{
					UUID: "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", Name: "NVIDIA GeForce RTX 4090",
					Architecture: "Ada Lovelace", PCIBusID: "0000:84:00.0", PCIDeviceID: "268410DE",
					VBIOS: "95.02.18.80.5F", DriverVersion: "535.86.05", CUDAVersion: "12.2",
					Persistence: "Enabled", ComputeMode: "Default",
					PowerLimitW: 450, DefaultPowerLimitW: 450, MaxPowerLimitW: 600,
					MemoryTotalMiB: 24564,
					ECC:            ECC{Current: "Disabled", Pending: "Disabled"},
					RowRemap:       &RowRemap{},
					PCIe:           PCIe{GenMax: 3, WidthMax: 16, WidthCurrent: 16},
				},
				Sample: Sample{
					PerformanceState: "P8", TemperatureC: 40, PowerDrawW: 26.84,
					MemoryUsedMiB: 2, MemoryFreeMiB: 24214,
					ClockGraphicsMHz: 210, ClockSMMHz: 210, ClockMemoryMHz: 405, PCIeGenCurrent: 1,
				},
			},
		},
		{
			// Ada, driver 595 (nvsmi_device_v13): SRAM uncorrectable split
			// into parity and SEC-DED, instant and average power draw,
			// "Requested functionality has been deprecated", processes.
			file: "rtx-4000-sff-ada.595.84.xml",
			want: GPU{
				Info: Info{
					UUID: "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026", Name: "NVIDIA RTX 4000 SFF Ada Generation",
					Architecture: "Ada Lovelace", PCIBusID: "0000:06:00.0", PCIDeviceID: "27B010DE",
					Serial: "REDACTED", VBIOS: "95.04.53.00.01", BoardPart: "900-5G192-1770-000",
					DriverVersion: "595.84", CUDAVersion: "13.2",
					Persistence: "Enabled", ComputeMode: "Default",
					PowerLimitW: 70, DefaultPowerLimitW: 70, MaxPowerLimitW: 70,
					MemoryTotalMiB: 20475,
					ECC:            ECC{Current: "Disabled", Pending: "Disabled"},
					RowRemap:       &RowRemap{},
					PCIe:           PCIe{GenMax: 4, WidthMax: 16, WidthCurrent: 16},
				},
				Sample: Sample{
					PerformanceState: "P8", TemperatureC: 38, PowerDrawW: 8.44,
					UtilizationGPU: 0, UtilizationMemory: 37,
					MemoryUsedMiB: 3534, MemoryFreeMiB: 16482,
					ClockGraphicsMHz: 210, ClockSMMHz: 210, ClockMemoryMHz: 405, PCIeGenCurrent: 1,
					Processes: []Process{
						{PID: 1842, Type: "G", Name: "cosmic-comp", UsedMemoryMiB: 410},
						{PID: 3190, Type: "G", Name: "/usr/bin/code", UsedMemoryMiB: 451},
						{PID: 4937, Type: "C", Name: "python", UsedMemoryMiB: 160},
						{PID: 34626, Type: "C+G", Name: "/usr/lib/chromium/chromium", UsedMemoryMiB: 183},
					},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			gpus := parseFile(t, tt.file)
			if len(gpus) != 1 {
				t.Fatalf("got %d GPUs, want 1", len(gpus))
			}
			diff(t, gpus[0], tt.want)
		})
	}
}

// gpuXML is a hand-written GPU in the newer schema with faults in every
// place Check looks.
const faultyXML = `<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
	<driver_version>550.54.15</driver_version>
	<cuda_version>12.4</cuda_version>
	<attached_gpus>2</attached_gpus>
	<gpu id="00000000:18:00.0">
		<product_name>NVIDIA H100 80GB HBM3</product_name>
		<uuid>GPU-9a02aaaa-0000-1111-2222-333344445555</uuid>
		<pci>
			<pci_bus_id>00000000:18:00.0</pci_bus_id>
			<pci_gpu_link_info>
				<pcie_gen><max_link_gen>5</max_link_gen><current_link_gen>5</current_link_gen></pcie_gen>
				<link_widths><max_link_width>16x</max_link_width><current_link_width>8x</current_link_width></link_widths>
			</pci_gpu_link_info>
		</pci>
		<ecc_mode><current_ecc>Enabled</current_ecc><pending_ecc>Enabled</pending_ecc></ecc_mode>
		<ecc_errors>
			<volatile>
				<sram_correctable>4</sram_correctable>
				<sram_uncorrectable_parity>1</sram_uncorrectable_parity>
				<sram_uncorrectable_secded>0</sram_uncorrectable_secded>
				<dram_correctable>7</dram_correctable>
				<dram_uncorrectable>2</dram_uncorrectable>
			</volatile>
			<aggregate>
				<sram_correctable>10</sram_correctable>
				<sram_uncorrectable_parity>1</sram_uncorrectable_parity>
				<sram_uncorrectable_secded>1</sram_uncorrectable_secded>
				<dram_correctable>20</dram_correctable>
				<dram_uncorrectable>5</dram_uncorrectable>
			</aggregate>
		</ecc_errors>
		<remapped_rows>
			<remapped_row_corr>1</remapped_row_corr>
			<remapped_row_unc>3</remapped_row_unc>
			<remapped_row_pending>Yes</remapped_row_pending>
			<remapped_row_failure>Yes</remapped_row_failure>
		</remapped_rows>
	</gpu>
	<gpu id="00000000:2A:00.0">
		<product_name>NVIDIA H100 80GB HBM3</product_name>
		<uuid>GPU-5f1caaaa-0000-1111-2222-333344445555</uuid>
		<pci><pci_bus_id>00000000:2A:00.0</pci_bus_id>
			<pci_gpu_link_info>
				<link_widths><max_link_width>16x</max_link_width><current_link_width>16x</current_link_width></link_widths>
			</pci_gpu_link_info>
		</pci>
		<ecc_mode><current_ecc>Enabled</current_ecc></ecc_mode>
		<ecc_errors><volatile><sram_correctable>0</sram_correctable><sram_uncorrectable>0</sram_uncorrectable>
			<dram_correctable>0</dram_correctable><dram_uncorrectable>0</dram_uncorrectable></volatile></ecc_errors>
		<remapped_rows>
			<remapped_row_corr>0</remapped_row_corr><remapped_row_unc>0</remapped_row_unc>
			<remapped_row_pending>No</remapped_row_pending><remapped_row_failure>No</remapped_row_failure>
		</remapped_rows>
	</gpu>
</nvidia_smi_log>
`

func TestParseXMLNewerECC(t *testing.T) {
	gpus, err := ParseXML(strings.NewReader(faultyXML))
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 {
		t.Fatalf("got %d GPUs, want 2", len(gpus))
	}
	g := gpus[0]
	diff(t, g.ECC, ECC{
		Current: "Enabled", Pending: "Enabled",
		Volatile:  ECCCounts{Supported: true, Correctable: 11, Uncorrectable: 3, DRAMUncorrectable: 2, SRAMUncorrectable: 1},
		Aggregate: ECCCounts{Supported: true, Correctable: 30, Uncorrectable: 7, DRAMUncorrectable: 5, SRAMUncorrectable: 2},
	})
	diff(t, g.RowRemap, &RowRemap{Correctable: 1, Uncorrectable: 3, Pending: true, Failure: true})
	diff(t, g.PCIe, PCIe{GenMax: 5, WidthMax: 16, WidthCurrent: 8})
	if g.PCIBusID != "0000:18:00.0" || gpus[1].PCIBusID != "0000:2a:00.0" || gpus[1].Index != 1 {
		t.Errorf("bus ids %q %q, index %d", g.PCIBusID, gpus[1].PCIBusID, gpus[1].Index)
	}
}

func TestParseXMLErrors(t *testing.T) {
	tests := []struct {
		name, in string
		gpus     int
		wantErr  bool
	}{
		{"empty", "", 0, true},
		{"not xml", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 0, true},
		{"other root", "<foo/>", 0, true},
		{"no gpus", "<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>", 0, false},
		{"truncated", "<nvidia_smi_log><gpu><uuid>GPU-1</uuid>", 0, true},
		{"nan and huge values", "<nvidia_smi_log><gpu><fb_memory_usage><total>NaN MiB</total><used>1e400 MiB</used></fb_memory_usage><gpu_power_readings><power_draw>Inf W</power_draw></gpu_power_readings></gpu></nvidia_smi_log>", 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gpus, err := ParseXML(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if len(gpus) != tt.gpus {
				t.Fatalf("got %d GPUs, want %d", len(gpus), tt.gpus)
			}
			for _, g := range gpus {
				if _, err := json.Marshal(g); err != nil {
					t.Errorf("record does not encode: %v", err)
				}
			}
		})
	}
}

func TestValueAndNumber(t *testing.T) {
	tests := []struct {
		in   string
		want float64
		ok   bool
	}{
		{"81920 MiB", 81920, true},
		{"16x", 16, true},
		{"67.03 W", 67.03, true},
		{" 27 C ", 27, true},
		{"-7 C", -7, true},
		{"N/A", 0, false},
		{"[N/A]", 0, false},
		{"[Not Supported]", 0, false},
		{"Requested functionality has been deprecated", 0, false},
		{"Enabled", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := number(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("number(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestAbsentValues: every word a driver prints for "no value" reads as
// absent, in a record and in its JSON (the inventory's), never as a
// string.
func TestAbsentValues(t *testing.T) {
	for _, s := range []string{"N/A", "[N/A]", "Not Found", "[Not Found]", "Not Supported", "[Not Supported]",
		"Unknown Error", "[Unknown Error]", "[Insufficient Permissions]", "None", " n/a ", "",
		"Requested functionality has been deprecated"} {
		if got := Value(s); got != "" {
			t.Errorf("Value(%q) = %q, want absent", s, got)
		}
	}
	for _, s := range []string{"NVIDIA A10G", "Enabled", "0-63", "Hopper", "GPU-5f1c"} {
		if got := Value(s); got != s {
			t.Errorf("Value(%q) = %q", s, got)
		}
	}
	const x = `<nvidia_smi_log><driver_version>[Unknown Error]</driver_version><cuda_version>Not Found</cuda_version>
<gpu id="00000000:17:00.0"><product_name>NVIDIA A10G</product_name><product_architecture>Unknown Error</product_architecture>
<persistence_mode>[Not Supported]</persistence_mode><serial>Not Found</serial><uuid>GPU-1</uuid><vbios_version>[N/A]</vbios_version>
<board_part_number>Not Supported</board_part_number><mig_mode><current_mig>[N/A]</current_mig><pending_mig>Not Found</pending_mig></mig_mode>
<compute_mode>Unknown Error</compute_mode><gpu_recovery_action>Unknown Error</gpu_recovery_action>
<ecc_mode><current_ecc>[Unknown Error]</current_ecc></ecc_mode>
<fabric><state>Not Supported</state><status>[Not Found]</status><cliqueId>N/A</cliqueId></fabric>
<pci><pci_gpu_link_info><link_widths><max_link_width>[Unknown Error]</max_link_width><current_link_width>Not Found</current_link_width></link_widths></pci_gpu_link_info></pci>
<temperature><gpu_temp>[Unknown Error]</gpu_temp></temperature><performance_state>Unknown Error</performance_state>
</gpu></nvidia_smi_log>`
	gpus, err := ParseXML(strings.NewReader(x))
	if err != nil || len(gpus) != 1 {
		t.Fatalf("ParseXML: %v, %d GPUs", err, len(gpus))
	}
	b, err := json.Marshal(gpus[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"N/A", "Not Found", "Not Supported", "Unknown Error", "[", "None"} {
		if strings.Contains(string(b), w) {
			t.Errorf("the record's JSON carries %q: %s", w, b)
		}
	}
	if gpus[0].Name != "NVIDIA A10G" || gpus[0].UUID != "GPU-1" {
		t.Errorf("name %q uuid %q", gpus[0].Name, gpus[0].UUID)
	}
}
