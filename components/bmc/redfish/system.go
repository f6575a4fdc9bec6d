package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// Power actions SetPower takes.
const (
	PowerOn    = "on"
	PowerOff   = "off"
	PowerCycle = "cycle"
)

// Boot devices SetBootDevice takes.
const (
	BootPXE  = "pxe"
	BootDisk = "disk"
	BootCD   = "cd"
)

// systemResource is what the client reads of a ComputerSystem.
type systemResource struct {
	ODataID      string `json:"@odata.id"`
	ID           string `json:"Id"`
	Name         string `json:"Name"`
	Manufacturer string `json:"Manufacturer"`
	Model        string `json:"Model"`
	SKU          string `json:"SKU"`
	PartNumber   string `json:"PartNumber"`
	SerialNumber string `json:"SerialNumber"`
	UUID         string `json:"UUID"`
	HostName     string `json:"HostName"`
	BiosVersion  string `json:"BiosVersion"`
	PowerState   string `json:"PowerState"`
	Boot         struct {
		Target  string   `json:"BootSourceOverrideTarget"`
		Enabled string   `json:"BootSourceOverrideEnabled"`
		Mode    string   `json:"BootSourceOverrideMode"`
		Allowed []string `json:"BootSourceOverrideTarget@Redfish.AllowableValues"`
	} `json:"Boot"`
	ProcessorSummary struct {
		Count flexInt `json:"Count"`
		Model string  `json:"Model"`
	} `json:"ProcessorSummary"`
	MemorySummary struct {
		TotalGiB flexFloat `json:"TotalSystemMemoryGiB"`
	} `json:"MemorySummary"`
	Processors         link `json:"Processors"`
	Memory             link `json:"Memory"`
	EthernetInterfaces link `json:"EthernetInterfaces"`
	Storage            link `json:"Storage"`
	SimpleStorage      link `json:"SimpleStorage"`
	Bios               link `json:"Bios"`
	VirtualMedia       link `json:"VirtualMedia"`
	Links              struct {
		ManagedBy []link `json:"ManagedBy"`
	} `json:"Links"`
	Actions struct {
		Reset struct {
			Target     string   `json:"target"`
			Allowed    []string `json:"ResetType@Redfish.AllowableValues"`
			ActionInfo string   `json:"@Redfish.ActionInfo"`
		} `json:"#ComputerSystem.Reset"`
	} `json:"Actions"`
}

// parseSystem decodes a ComputerSystem body.
func parseSystem(b []byte) (*systemResource, error) {
	var s systemResource
	if err := decode(b, &s); err != nil {
		return nil, fmt.Errorf("computer system: %w", err)
	}
	return &s, nil
}

// links lists the navigation links of s the client may follow.
func (s *systemResource) links() []string {
	out := []string{s.ODataID, s.Processors.ID, s.Memory.ID, s.EthernetInterfaces.ID, s.Storage.ID,
		s.SimpleStorage.ID, s.Bios.ID, s.VirtualMedia.ID, s.Actions.Reset.Target, s.Actions.Reset.ActionInfo}
	for _, m := range s.Links.ManagedBy {
		out = append(out, m.ID)
	}
	return out
}

// systemPath finds the system: /redfish/v1/Systems/<SystemID>, else the
// first member of the Systems collection.
func (c *Client) systemPath(ctx context.Context) (string, error) {
	if c.system != "" {
		return c.system, nil
	}
	if err := c.login(ctx); err != nil {
		return "", err
	}
	if c.SystemID != "" {
		c.system = Root + "/Systems/" + c.SystemID
		return c.system, nil
	}
	members, err := c.members(ctx, c.root.Systems.or(Root+"/Systems"))
	if err != nil {
		return "", err
	}
	if len(members) == 0 {
		return "", errors.New("redfish: the BMC lists no systems")
	}
	c.system = members[0]
	return c.system, nil
}

// getSystem reads the system and its ETag.
func (c *Client) getSystem(ctx context.Context) (*systemResource, string, error) {
	p, err := c.systemPath(ctx)
	if err != nil {
		return nil, "", err
	}
	r, err := c.get(ctx, p)
	if err != nil {
		return nil, "", err
	}
	s, err := parseSystem(r.body)
	if err != nil {
		return nil, "", fmt.Errorf("redfish: GET %s: %w", p, err)
	}
	if c.SystemID != "" && s.ID != "" && s.ID != c.SystemID {
		return nil, "", fmt.Errorf("redfish: %s answers as system %s", p, printable(s.ID))
	}
	return s, etagOf(r), nil
}

// Power returns the system's PowerState (On, Off, PoweringOn, PoweringOff).
func (c *Client) Power(ctx context.Context) (string, error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return "", err
	}
	return clean(s.PowerState, 32), nil
}

// SetPower turns the system on, off (forced) or power-cycles it, with the
// ResetType the system advertises for that action. It returns the
// ResetType sent, or "" when the system already was in the state asked for.
func (c *Client) SetPower(ctx context.Context, action string) (string, error) {
	if action != PowerOn && action != PowerOff && action != PowerCycle {
		return "", fmt.Errorf("redfish: power action %q is not on, off or cycle", action)
	}
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return "", err
	}
	allowed := s.Actions.Reset.Allowed
	if len(allowed) == 0 && s.Actions.Reset.ActionInfo != "" {
		allowed = c.resetTypesFromActionInfo(ctx, s.Actions.Reset.ActionInfo)
	}
	target := s.Actions.Reset.Target
	if target == "" {
		target = defaultResetTarget(c.system)
	}
	rt, err := resetTypeFor(action, s.PowerState, allowed)
	if errors.Is(err, errNoPowerCycle) {
		return c.offThenOn(ctx, target, allowed)
	}
	if err != nil || rt == "" {
		return "", err
	}
	_, err = c.post(ctx, target, map[string]string{"ResetType": rt})
	if err != nil && rt == "PowerCycle" && len(allowed) == 0 && StatusOf(err) == http.StatusBadRequest {
		// PowerCycle sent unadvertised and refused as a parameter: the
		// system lacks it, so it is cycled off and on.
		return c.offThenOn(ctx, target, allowed)
	}
	if err != nil {
		return "", err
	}
	return rt, nil
}

// DefaultPowerOffWait bounds how long a cycle waits for the system to read
// Off after its ForceOff; DefaultPowerPoll is how often it reads.
const (
	DefaultPowerOffWait = 3 * time.Minute
	DefaultPowerPoll    = 2 * time.Second
)

// offThenOn cycles a system that does not allow PowerCycle: ForceOff (else
// GracefulShutdown), then reads the power state until it is Off, then On
// (else ForceOn, else PushPowerButton). It returns "ForceOff,On" (the
// ResetTypes sent). A system that never reads Off is left off with an
// error saying so: turning it on while it may still be going down is what
// BMCs refuse or, worse, ignore.
func (c *Client) offThenOn(ctx context.Context, target string, allowed []string) (string, error) {
	off, err := resetTypeFor(PowerOff, "On", allowed)
	if err != nil {
		return "", err
	}
	if _, err := c.post(ctx, target, map[string]string{"ResetType": off}); err != nil {
		return "", fmt.Errorf("power cycle (off, then on): %w", err)
	}
	wait, poll := c.PowerOffWait, c.PowerPoll
	if wait <= 0 {
		wait = DefaultPowerOffWait
	}
	if poll <= 0 {
		poll = DefaultPowerPoll
	}
	deadline := time.Now().Add(wait)
	state := ""
	for {
		s, _, err := c.getSystem(ctx)
		if err != nil {
			return off, fmt.Errorf("power cycle: reading the power state after %s: %w", off, err)
		}
		if state = clean(s.PowerState, 32); state == "Off" {
			break
		}
		if time.Now().After(deadline) {
			return off, fmt.Errorf("power cycle: the system still reads %q %s after %s; it was not turned on again", state, wait, off)
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return off, fmt.Errorf("power cycle: waiting for Off after %s: %w", off, ctx.Err())
		case <-t.C:
		}
	}
	on, err := resetTypeFor(PowerOn, "Off", allowed)
	if err != nil {
		return off, err
	}
	if _, err := c.post(ctx, target, map[string]string{"ResetType": on}); err != nil {
		return off, fmt.Errorf("power cycle: the system is off; turning it on: %w", err)
	}
	return off + "," + on, nil
}

var bootTargets = map[string]string{BootPXE: "Pxe", BootDisk: "Hdd", BootCD: "Cd"}

// SetBootDevice sets the boot source override: pxe, disk or cd, for the
// next boot only (once) or until changed.
func (c *Client) SetBootDevice(ctx context.Context, device string, once bool) error {
	target, ok := bootTargets[device]
	if !ok {
		return fmt.Errorf("redfish: boot device %q is not pxe, disk or cd", device)
	}
	s, etag, err := c.getSystem(ctx)
	if err != nil {
		return err
	}
	if len(s.Boot.Allowed) > 0 && !slices.Contains(s.Boot.Allowed, target) {
		return fmt.Errorf("redfish: the system does not offer %s as a boot source override", target)
	}
	enabled := "Continuous"
	if once {
		enabled = "Once"
	}
	body, err := json.Marshal(map[string]any{"Boot": map[string]string{
		"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": enabled,
	}})
	if err != nil {
		return err
	}
	return c.patch(ctx, c.system, etag, body)
}

// BootOverride returns the system's boot source override target and
// whether it is Once, Continuous or Disabled.
func (c *Client) BootOverride(ctx context.Context) (target, enabled string, err error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return "", "", err
	}
	return clean(s.Boot.Target, 32), clean(s.Boot.Enabled, 32), nil
}
