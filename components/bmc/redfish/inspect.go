package redfish

import (
	"context"
	"fmt"
	"net"
	"strings"
)

// Inventory is what Inspect reports of a system.
type Inventory struct {
	System     System      `json:"system"`
	Processors []Processor `json:"processors"`
	Memory     []Memory    `json:"memory"`
	NICs       []NIC       `json:"nics"`
	Storage    []Drive     `json:"storage"`
}

// System is the ComputerSystem's identity.
type System struct {
	ID             string  `json:"id"`
	Manufacturer   string  `json:"manufacturer,omitempty"`
	Model          string  `json:"model,omitempty"`
	SKU            string  `json:"sku,omitempty"`
	PartNumber     string  `json:"part_number,omitempty"`
	SerialNumber   string  `json:"serial_number,omitempty"`
	UUID           string  `json:"uuid,omitempty"`
	HostName       string  `json:"host_name,omitempty"`
	BIOSVersion    string  `json:"bios_version,omitempty"`
	PowerState     string  `json:"power_state,omitempty"`
	ProcessorCount int64   `json:"processor_count,omitempty"`
	MemoryGiB      float64 `json:"memory_gib,omitempty"`
}

// Processor is one processor (CPU, GPU, FPGA...).
type Processor struct {
	ID           string `json:"id"`
	Socket       string `json:"socket,omitempty"`
	Type         string `json:"type,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	Model        string `json:"model,omitempty"`
	Cores        int64  `json:"cores,omitempty"`
	Threads      int64  `json:"threads,omitempty"`
	MaxSpeedMHz  int64  `json:"max_speed_mhz,omitempty"`
	State        string `json:"state,omitempty"`
}

// Memory is one present memory module.
type Memory struct {
	ID           string `json:"id"`
	DeviceType   string `json:"device_type,omitempty"`
	CapacityMiB  int64  `json:"capacity_mib,omitempty"`
	SpeedMHz     int64  `json:"speed_mhz,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	PartNumber   string `json:"part_number,omitempty"`
	SerialNumber string `json:"serial_number,omitempty"`
	State        string `json:"state,omitempty"`
}

// NIC is one of the system's Ethernet interfaces. MAC addresses are
// lower-case, colon-separated; empty when the BMC sent none or a malformed
// one.
type NIC struct {
	ID           string `json:"id"`
	Type         string `json:"type,omitempty"` // Physical or Virtual
	MAC          string `json:"mac,omitempty"`
	PermanentMAC string `json:"permanent_mac,omitempty"`
	LinkStatus   string `json:"link_status,omitempty"`
	SpeedMbps    int64  `json:"speed_mbps,omitempty"`
	State        string `json:"state,omitempty"`
}

// Drive is one present drive, from Storage or, on BMCs without it,
// SimpleStorage.
type Drive struct {
	ID            string `json:"id"`
	Controller    string `json:"controller,omitempty"`
	Model         string `json:"model,omitempty"`
	Manufacturer  string `json:"manufacturer,omitempty"`
	SerialNumber  string `json:"serial_number,omitempty"`
	CapacityBytes int64  `json:"capacity_bytes,omitempty"`
	MediaType     string `json:"media_type,omitempty"`
	Protocol      string `json:"protocol,omitempty"`
	State         string `json:"state,omitempty"`
}

type status struct {
	State string `json:"State"`
}

// Inspect reads the system, its processors, memory, NICs and storage.
func (c *Client) Inspect(ctx context.Context) (*Inventory, error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{System: s.summary(), Processors: []Processor{}, Memory: []Memory{}, NICs: []NIC{}, Storage: []Drive{}}
	if s.Processors.ID != "" {
		if inv.Processors, err = c.processors(ctx, s.Processors.ID); err != nil {
			return nil, fmt.Errorf("processors: %w", err)
		}
	}
	if s.Memory.ID != "" {
		if inv.Memory, err = c.memory(ctx, s.Memory.ID); err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
	}
	if s.EthernetInterfaces.ID != "" {
		if inv.NICs, err = c.nics(ctx, s.EthernetInterfaces.ID); err != nil {
			return nil, fmt.Errorf("ethernet interfaces: %w", err)
		}
	}
	switch {
	case s.Storage.ID != "":
		if inv.Storage, err = c.storage(ctx, s.Storage.ID); err != nil {
			return nil, fmt.Errorf("storage: %w", err)
		}
	case s.SimpleStorage.ID != "":
		if inv.Storage, err = c.simpleStorage(ctx, s.SimpleStorage.ID); err != nil {
			return nil, fmt.Errorf("simple storage: %w", err)
		}
	}
	return inv, nil
}

func (s *systemResource) summary() System {
	return System{
		ID: clean(s.ID, 128), Manufacturer: clean(s.Manufacturer, 128), Model: clean(s.Model, 128),
		SKU: clean(s.SKU, 128), PartNumber: clean(s.PartNumber, 128), SerialNumber: clean(s.SerialNumber, 128),
		UUID: clean(s.UUID, 64), HostName: clean(s.HostName, 255), BIOSVersion: clean(s.BiosVersion, 128),
		PowerState: clean(s.PowerState, 32), ProcessorCount: int64(s.ProcessorSummary.Count),
		MemoryGiB: float64(s.MemorySummary.TotalGiB),
	}
}

func (c *Client) processors(ctx context.Context, coll string) ([]Processor, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return nil, err
	}
	out := []Processor{}
	for _, p := range paths {
		var r struct {
			ID           string  `json:"Id"`
			Socket       string  `json:"Socket"`
			Type         string  `json:"ProcessorType"`
			Manufacturer string  `json:"Manufacturer"`
			Model        string  `json:"Model"`
			Cores        flexInt `json:"TotalCores"`
			Threads      flexInt `json:"TotalThreads"`
			MaxSpeed     flexInt `json:"MaxSpeedMHz"`
			Status       status  `json:"Status"`
		}
		if _, err := c.getJSON(ctx, p, &r); err != nil {
			return nil, err
		}
		if r.Status.State == "Absent" {
			continue
		}
		out = append(out, Processor{
			ID: clean(r.ID, 128), Socket: clean(r.Socket, 64), Type: clean(r.Type, 32),
			Manufacturer: clean(r.Manufacturer, 128), Model: clean(r.Model, 128), Cores: int64(r.Cores),
			Threads: int64(r.Threads), MaxSpeedMHz: int64(r.MaxSpeed), State: clean(r.Status.State, 32),
		})
	}
	return out, nil
}

func (c *Client) memory(ctx context.Context, coll string) ([]Memory, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return nil, err
	}
	out := []Memory{}
	for _, p := range paths {
		var r struct {
			ID           string  `json:"Id"`
			DeviceType   string  `json:"MemoryDeviceType"`
			CapacityMiB  flexInt `json:"CapacityMiB"`
			SpeedMHz     flexInt `json:"OperatingSpeedMhz"`
			Manufacturer string  `json:"Manufacturer"`
			PartNumber   string  `json:"PartNumber"`
			SerialNumber string  `json:"SerialNumber"`
			Status       status  `json:"Status"`
		}
		if _, err := c.getJSON(ctx, p, &r); err != nil {
			return nil, err
		}
		if r.Status.State == "Absent" {
			continue
		}
		out = append(out, Memory{
			ID: clean(r.ID, 128), DeviceType: clean(r.DeviceType, 32), CapacityMiB: int64(r.CapacityMiB),
			SpeedMHz: int64(r.SpeedMHz), Manufacturer: clean(r.Manufacturer, 128),
			PartNumber: clean(r.PartNumber, 128), SerialNumber: clean(r.SerialNumber, 128), State: clean(r.Status.State, 32),
		})
	}
	return out, nil
}

func (c *Client) nics(ctx context.Context, coll string) ([]NIC, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return nil, err
	}
	out := []NIC{}
	for _, p := range paths {
		var r struct {
			ID           string  `json:"Id"`
			Type         string  `json:"EthernetInterfaceType"`
			MAC          string  `json:"MACAddress"`
			PermanentMAC string  `json:"PermanentMACAddress"`
			LinkStatus   string  `json:"LinkStatus"`
			SpeedMbps    flexInt `json:"SpeedMbps"`
			Status       status  `json:"Status"`
		}
		if _, err := c.getJSON(ctx, p, &r); err != nil {
			return nil, err
		}
		out = append(out, NIC{
			ID: clean(r.ID, 128), Type: clean(r.Type, 32), MAC: normalMAC(r.MAC), PermanentMAC: normalMAC(r.PermanentMAC),
			LinkStatus: clean(r.LinkStatus, 32), SpeedMbps: int64(r.SpeedMbps), State: clean(r.Status.State, 32),
		})
	}
	return out, nil
}

// normalMAC returns a 6-byte MAC in lower-case colon form, or "".
func normalMAC(s string) string {
	mac, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(mac) != 6 {
		return ""
	}
	return mac.String()
}

func (c *Client) storage(ctx context.Context, coll string) ([]Drive, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return nil, err
	}
	out := []Drive{}
	for _, p := range paths {
		var st struct {
			ID     string `json:"Id"`
			Drives []link `json:"Drives"`
		}
		if _, err := c.getJSON(ctx, p, &st); err != nil {
			return nil, err
		}
		for _, d := range st.Drives {
			if len(out) == maxMembers {
				return out, nil
			}
			var r struct {
				ID            string  `json:"Id"`
				Model         string  `json:"Model"`
				Manufacturer  string  `json:"Manufacturer"`
				SerialNumber  string  `json:"SerialNumber"`
				CapacityBytes flexInt `json:"CapacityBytes"`
				MediaType     string  `json:"MediaType"`
				Protocol      string  `json:"Protocol"`
				Status        status  `json:"Status"`
			}
			if _, err := c.getJSON(ctx, d.ID, &r); err != nil {
				return nil, err
			}
			if r.Status.State == "Absent" {
				continue
			}
			out = append(out, Drive{
				ID: clean(r.ID, 128), Controller: clean(st.ID, 128), Model: clean(r.Model, 128),
				Manufacturer: clean(r.Manufacturer, 128), SerialNumber: clean(r.SerialNumber, 128),
				CapacityBytes: int64(r.CapacityBytes), MediaType: clean(r.MediaType, 32),
				Protocol: clean(r.Protocol, 32), State: clean(r.Status.State, 32),
			})
		}
	}
	return out, nil
}

func (c *Client) simpleStorage(ctx context.Context, coll string) ([]Drive, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return nil, err
	}
	out := []Drive{}
	for _, p := range paths {
		var st struct {
			ID      string `json:"Id"`
			Devices []struct {
				Name          string  `json:"Name"`
				Model         string  `json:"Model"`
				Manufacturer  string  `json:"Manufacturer"`
				CapacityBytes flexInt `json:"CapacityBytes"`
				Status        status  `json:"Status"`
			} `json:"Devices"`
		}
		if _, err := c.getJSON(ctx, p, &st); err != nil {
			return nil, err
		}
		for _, d := range st.Devices {
			if d.Status.State == "Absent" {
				continue
			}
			if len(out) == maxMembers {
				return out, nil
			}
			out = append(out, Drive{
				ID: clean(d.Name, 128), Controller: clean(st.ID, 128), Model: clean(d.Model, 128),
				Manufacturer: clean(d.Manufacturer, 128), CapacityBytes: int64(d.CapacityBytes),
				State: clean(d.Status.State, 32),
			})
		}
	}
	return out, nil
}
