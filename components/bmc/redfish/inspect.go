package redfish

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Inventory is what Inspect reports of a system.
type Inventory struct {
	System     System      `json:"system"`
	Processors []Processor `json:"processors"`
	Memory     []Memory    `json:"memory"`
	NICs       []NIC       `json:"nics"`
	Storage    []Drive     `json:"storage"`
	// Unread lists what the BMC links but the client could not read (an
	// absent resource, a drive that answers 500, a body that does not
	// parse); the rest of the inventory is still reported.
	Unread []Unread `json:"unread,omitempty"`
}

// Unread is one resource Inspect could not read, and why.
type Unread struct {
	Resource string `json:"resource"`
	Error    string `json:"error"`
}

// maxUnread bounds the Unread list.
const maxUnread = 64

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
	Health        string `json:"health,omitempty"`
}

type status struct {
	State  string `json:"State"`
	Health string `json:"Health"`
}

// inspection gathers what one Inspect reads and what it could not.
type inspection struct {
	c      *Client
	unread []Unread
}

// fatal reports whether err ends the whole inspection: a link that leaves
// /redfish/v1 (a hostile BMC, not a broken part), refused credentials, a
// pin mismatch or the context's end. Anything else is one unreadable part.
func fatal(err error) bool {
	s := StatusOf(err)
	return errors.Is(err, ErrOutsideRoot) || errors.Is(err, ErrPinMismatch) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		s == http.StatusUnauthorized || s == http.StatusForbidden
}

// skip records an unreadable resource, or returns err when it is fatal.
func (in *inspection) skip(resource string, err error) error {
	if fatal(err) {
		return err
	}
	if len(in.unread) < maxUnread {
		in.unread = append(in.unread, Unread{Resource: clean(resource, 256), Error: clean(in.c.redact(err.Error()), 512)})
	}
	return nil
}

// each reads every member of a collection into parse; a member that cannot
// be read or parsed is recorded, not fatal.
func (in *inspection) each(ctx context.Context, coll string, read func(p string, body []byte) error) error {
	paths, err := in.c.members(ctx, coll)
	if err != nil {
		return in.skip(coll, err)
	}
	for _, p := range paths {
		r, err := in.c.get(ctx, p)
		if err == nil {
			if err = read(p, r.body); err != nil {
				err = fmt.Errorf("redfish: GET %s: %w", printable(p), err)
			}
		}
		if err != nil {
			if err := in.skip(p, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// Inspect reads the system, its processors, memory, NICs and storage. It
// reports what it could read and lists in Unread what it could not: one
// absent or failing part never fails the whole inspection. Storage comes
// from Storage, else (no Storage, or one that cannot be read or lists no
// controller) from SimpleStorage. Only an unreadable system, a link
// leaving /redfish/v1, refused credentials or the context's end fail it.
func (c *Client) Inspect(ctx context.Context) (*Inventory, error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{System: s.summary(), Processors: []Processor{}, Memory: []Memory{}, NICs: []NIC{}, Storage: []Drive{}}
	in := &inspection{c: c}
	steps := []struct {
		link string
		read func(*Client, context.Context, *inspection, string, *Inventory) error
	}{
		{s.Processors.ID, (*Client).processors},
		{s.Memory.ID, (*Client).memory},
		{s.EthernetInterfaces.ID, (*Client).nics},
	}
	for _, st := range steps {
		if st.link == "" {
			continue
		}
		if err := st.read(c, ctx, in, st.link, inv); err != nil {
			return nil, err
		}
	}
	simple := s.Storage.ID == ""
	if s.Storage.ID != "" {
		ok, err := c.storage(ctx, in, s.Storage.ID, inv)
		if err != nil {
			return nil, err
		}
		simple = !ok
	}
	if simple && s.SimpleStorage.ID != "" {
		if err := c.simpleStorage(ctx, in, s.SimpleStorage.ID, inv); err != nil {
			return nil, err
		}
	}
	inv.Unread = in.unread
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

// processorBody is what the client reads of a Processor.
type processorBody struct {
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

func (c *Client) processors(ctx context.Context, in *inspection, coll string, inv *Inventory) error {
	return in.each(ctx, coll, func(_ string, b []byte) error { return readProcessor(b, inv) })
}

// readProcessor decodes one body into inv.
func readProcessor(b []byte, inv *Inventory) error {
	var r processorBody
	if err := decode(b, &r); err != nil {
		return err
	}
	if r.Status.State != "Absent" {
		inv.Processors = append(inv.Processors, Processor{
			ID: clean(r.ID, 128), Socket: clean(r.Socket, 64), Type: clean(r.Type, 32),
			Manufacturer: clean(r.Manufacturer, 128), Model: clean(r.Model, 128), Cores: int64(r.Cores),
			Threads: int64(r.Threads), MaxSpeedMHz: int64(r.MaxSpeed), State: clean(r.Status.State, 32),
		})
	}
	return nil
}

// memoryBody is what the client reads of a Memory module.
type memoryBody struct {
	ID           string  `json:"Id"`
	DeviceType   string  `json:"MemoryDeviceType"`
	CapacityMiB  flexInt `json:"CapacityMiB"`
	SpeedMHz     flexInt `json:"OperatingSpeedMhz"`
	Manufacturer string  `json:"Manufacturer"`
	PartNumber   string  `json:"PartNumber"`
	SerialNumber string  `json:"SerialNumber"`
	Status       status  `json:"Status"`
}

func (c *Client) memory(ctx context.Context, in *inspection, coll string, inv *Inventory) error {
	return in.each(ctx, coll, func(_ string, b []byte) error { return readMemory(b, inv) })
}

// readMemory decodes one body into inv.
func readMemory(b []byte, inv *Inventory) error {
	var r memoryBody
	if err := decode(b, &r); err != nil {
		return err
	}
	if r.Status.State != "Absent" {
		inv.Memory = append(inv.Memory, Memory{
			ID: clean(r.ID, 128), DeviceType: clean(r.DeviceType, 32), CapacityMiB: int64(r.CapacityMiB),
			SpeedMHz: int64(r.SpeedMHz), Manufacturer: clean(r.Manufacturer, 128),
			PartNumber: clean(r.PartNumber, 128), SerialNumber: clean(r.SerialNumber, 128), State: clean(r.Status.State, 32),
		})
	}
	return nil
}

// nicBody is what the client reads of an EthernetInterface.
type nicBody struct {
	ID           string  `json:"Id"`
	Type         string  `json:"EthernetInterfaceType"`
	MAC          string  `json:"MACAddress"`
	PermanentMAC string  `json:"PermanentMACAddress"`
	LinkStatus   string  `json:"LinkStatus"`
	SpeedMbps    flexInt `json:"SpeedMbps"`
	Status       status  `json:"Status"`
}

func (c *Client) nics(ctx context.Context, in *inspection, coll string, inv *Inventory) error {
	return in.each(ctx, coll, func(_ string, b []byte) error { return readNIC(b, inv) })
}

// readNIC decodes one body into inv.
func readNIC(b []byte, inv *Inventory) error {
	var r nicBody
	if err := decode(b, &r); err != nil {
		return err
	}
	inv.NICs = append(inv.NICs, NIC{
		ID: clean(r.ID, 128), Type: clean(r.Type, 32), MAC: normalMAC(r.MAC), PermanentMAC: normalMAC(r.PermanentMAC),
		LinkStatus: clean(r.LinkStatus, 32), SpeedMbps: int64(r.SpeedMbps), State: clean(r.Status.State, 32),
	})
	return nil
}

// normalMAC returns a 6-byte MAC in lower-case colon form, or "".
func normalMAC(s string) string {
	mac, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(mac) != 6 {
		return ""
	}
	return mac.String()
}

// storageBody is what the client reads of a Storage controller.
type storageBody struct {
	ID     string `json:"Id"`
	Drives []link `json:"Drives"`
}

// driveBody is what the client reads of a Drive.
type driveBody struct {
	ID            string  `json:"Id"`
	Model         string  `json:"Model"`
	Manufacturer  string  `json:"Manufacturer"`
	SerialNumber  string  `json:"SerialNumber"`
	CapacityBytes flexInt `json:"CapacityBytes"`
	MediaType     string  `json:"MediaType"`
	Protocol      string  `json:"Protocol"`
	Status        status  `json:"Status"`
}

func (d *driveBody) drive(controller string) Drive {
	return Drive{
		ID: clean(d.ID, 128), Controller: clean(controller, 128), Model: clean(d.Model, 128),
		Manufacturer: clean(d.Manufacturer, 128), SerialNumber: clean(d.SerialNumber, 128),
		CapacityBytes: int64(d.CapacityBytes), MediaType: clean(d.MediaType, 32),
		Protocol: clean(d.Protocol, 32), State: clean(d.Status.State, 32), Health: clean(d.Status.Health, 32),
	}
}

// storage reads the drives of every Storage controller. It reports false
// when the Storage collection could not be read or lists no controller,
// so the caller falls back to SimpleStorage.
func (c *Client) storage(ctx context.Context, in *inspection, coll string, inv *Inventory) (bool, error) {
	paths, err := c.members(ctx, coll)
	if err != nil {
		return false, in.skip(coll, err)
	}
	for _, p := range paths {
		var st storageBody
		if _, err := c.getJSON(ctx, p, &st); err != nil {
			if err := in.skip(p, err); err != nil {
				return false, err
			}
			continue
		}
		for _, d := range st.Drives {
			if len(inv.Storage) == maxMembers {
				return true, nil
			}
			var r driveBody
			if _, err := c.getJSON(ctx, d.ID, &r); err != nil {
				if err := in.skip(d.ID, err); err != nil {
					return false, err
				}
				continue
			}
			if r.Status.State != "Absent" {
				inv.Storage = append(inv.Storage, r.drive(st.ID))
			}
		}
	}
	return len(paths) > 0, nil
}

// simpleStorageBody is what the client reads of a SimpleStorage controller.
type simpleStorageBody struct {
	ID      string `json:"Id"`
	Devices []struct {
		Name          string  `json:"Name"`
		Model         string  `json:"Model"`
		Manufacturer  string  `json:"Manufacturer"`
		CapacityBytes flexInt `json:"CapacityBytes"`
		Status        status  `json:"Status"`
	} `json:"Devices"`
}

func (c *Client) simpleStorage(ctx context.Context, in *inspection, coll string, inv *Inventory) error {
	return in.each(ctx, coll, func(_ string, b []byte) error { return readSimpleStorage(b, inv) })
}

// readSimpleStorage decodes one body into inv.
func readSimpleStorage(b []byte, inv *Inventory) error {
	var st simpleStorageBody
	if err := decode(b, &st); err != nil {
		return err
	}
	for _, d := range st.Devices {
		if d.Status.State == "Absent" {
			continue
		}
		if len(inv.Storage) == maxMembers {
			return nil
		}
		inv.Storage = append(inv.Storage, Drive{
			ID: clean(d.Name, 128), Controller: clean(st.ID, 128), Model: clean(d.Model, 128),
			Manufacturer: clean(d.Manufacturer, 128), CapacityBytes: int64(d.CapacityBytes),
			State: clean(d.Status.State, 32), Health: clean(d.Status.Health, 32),
		})
	}
	return nil
}
