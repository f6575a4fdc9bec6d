package redfish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"unicode/utf8"
)

// ValidImageURL checks an image URL a BMC is to fetch: http or https, a
// host, no user information (credentials do not travel in URLs), at most
// 2048 bytes, no control characters.
func ValidImageURL(s string) error {
	if s == "" || len(s) > 2048 {
		return errors.New("image url: empty or longer than 2048 bytes")
	}
	for _, r := range s {
		if r < 0x21 || r == 0x7f || r == utf8.RuneError {
			return errors.New("image url: contains spaces or control characters")
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("image url: does not parse")
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return errors.New("image url: must be http or https")
	}
	if u.Host == "" || u.User != nil {
		return errors.New("image url: needs a host and no user information")
	}
	return nil
}

// Firmware is one entry of the firmware inventory.
type Firmware struct {
	ID           string `json:"id"`
	Name         string `json:"name,omitempty"`
	Version      string `json:"version,omitempty"`
	Manufacturer string `json:"manufacturer,omitempty"`
	ReleaseDate  string `json:"release_date,omitempty"`
	SoftwareID   string `json:"software_id,omitempty"`
	Updateable   bool   `json:"updateable"`
	State        string `json:"state,omitempty"`
}

// FirmwareInventory lists UpdateService/FirmwareInventory.
func (c *Client) FirmwareInventory(ctx context.Context) ([]Firmware, error) {
	if err := c.login(ctx); err != nil {
		return nil, err
	}
	var us struct {
		FirmwareInventory link `json:"FirmwareInventory"`
	}
	if _, err := c.getJSON(ctx, c.root.UpdateService.or(Root+"/UpdateService"), &us); err != nil {
		return nil, err
	}
	paths, err := c.members(ctx, us.FirmwareInventory.or(Root+"/UpdateService/FirmwareInventory"))
	if err != nil {
		return nil, err
	}
	out := []Firmware{}
	for _, p := range paths {
		var r struct {
			ID           string   `json:"Id"`
			Name         string   `json:"Name"`
			Version      string   `json:"Version"`
			Manufacturer string   `json:"Manufacturer"`
			ReleaseDate  string   `json:"ReleaseDate"`
			SoftwareID   string   `json:"SoftwareId"`
			Updateable   flexBool `json:"Updateable"`
			Status       status   `json:"Status"`
		}
		if _, err := c.getJSON(ctx, p, &r); err != nil {
			return nil, err
		}
		out = append(out, Firmware{
			ID: clean(r.ID, 128), Name: clean(r.Name, 128), Version: clean(r.Version, 128),
			Manufacturer: clean(r.Manufacturer, 128), ReleaseDate: clean(r.ReleaseDate, 64),
			SoftwareID: clean(r.SoftwareID, 128), Updateable: bool(r.Updateable), State: clean(r.Status.State, 32),
		})
	}
	return out, nil
}

// maxAccounts bounds the accounts RotatePassword reads to find its own.
const maxAccounts = 64

// RotatePassword sets the password of the account the client logged in
// with (PATCH Password on its AccountService account). From then on the
// client authenticates with newPassword, which it references, not copies.
func (c *Client) RotatePassword(ctx context.Context, newPassword []byte) error {
	if len(newPassword) == 0 {
		return errors.New("redfish: empty new password")
	}
	c.redactAlt = append(c.redactAlt, newPassword)
	if err := c.login(ctx); err != nil {
		return err
	}
	var as struct {
		Accounts link    `json:"Accounts"`
		MinLen   flexInt `json:"MinPasswordLength"`
		MaxLen   flexInt `json:"MaxPasswordLength"`
	}
	if _, err := c.getJSON(ctx, c.root.AccountService.or(Root+"/AccountService"), &as); err != nil {
		return err
	}
	n := int64(utf8.RuneCount(newPassword))
	if as.MinLen > 0 && n < int64(as.MinLen) {
		return fmt.Errorf("redfish: the new password has %d characters; the BMC wants at least %d", n, as.MinLen)
	}
	if as.MaxLen > 0 && n > int64(as.MaxLen) {
		return fmt.Errorf("redfish: the new password has %d characters; the BMC takes at most %d", n, as.MaxLen)
	}
	paths, err := c.members(ctx, as.Accounts.or(Root+"/AccountService/Accounts"))
	if err != nil {
		return err
	}
	account, etag := "", ""
	for i, p := range paths {
		if i == maxAccounts {
			break
		}
		var a struct {
			UserName string `json:"UserName"`
		}
		r, err := c.get(ctx, p)
		if err != nil {
			return err
		}
		if err := decode(r.body, &a); err != nil {
			return fmt.Errorf("redfish: GET %s: %w", p, err)
		}
		if a.UserName != "" && bytes.Equal([]byte(a.UserName), c.Username) {
			account, etag = p, etagOf(r)
			break
		}
	}
	if account == "" {
		return errors.New("redfish: no account of the BMC has the user name the client logged in with")
	}
	body := secretBody([]byte("Password"), newPassword)
	defer clear(body)
	if err := c.patch(ctx, account, etag, body); err != nil {
		return err
	}
	c.Password = newPassword
	return nil
}

// BIOS is a system's BIOS attributes.
type BIOS struct {
	Registry   string         `json:"attribute_registry,omitempty"`
	Attributes map[string]any `json:"attributes"`
	// Pending holds the attributes of the pending settings that differ
	// from the current ones (applied at the next reset).
	Pending map[string]any `json:"pending,omitempty"`
	// SettingsObject is where the pending settings live, as the BIOS's
	// @Redfish.Settings names it; empty when it names none (then nothing
	// can be staged and Pending is unknown).
	SettingsObject string `json:"settings_object,omitempty"`
}

type biosResource struct {
	Registry   string                     `json:"AttributeRegistry"`
	Attributes map[string]json.RawMessage `json:"Attributes"`
	Settings   struct {
		SettingsObject link     `json:"SettingsObject"`
		ApplyTimes     []string `json:"SupportedApplyTimes"`
	} `json:"@Redfish.Settings"`
}

// maxAttributes bounds the BIOS attributes read or set.
const maxAttributes = 4096

// parseBIOS decodes a Bios body.
func parseBIOS(body []byte) (*biosResource, error) {
	var b biosResource
	if err := decode(body, &b); err != nil {
		return nil, fmt.Errorf("bios: %w", err)
	}
	if len(b.Attributes) > maxAttributes {
		return nil, fmt.Errorf("bios: more than %d attributes", maxAttributes)
	}
	return &b, nil
}

func (c *Client) bios(ctx context.Context) (string, *biosResource, error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return "", nil, err
	}
	p := s.Bios.or(c.system + "/Bios")
	r, err := c.get(ctx, p)
	if err != nil {
		return "", nil, err
	}
	b, err := parseBIOS(r.body)
	if err != nil {
		return "", nil, fmt.Errorf("redfish: GET %s: %w", printable(p), err)
	}
	return p, b, nil
}

// BIOS reads the current BIOS attributes and the pending changes.
func (c *Client) BIOS(ctx context.Context) (*BIOS, error) {
	p, b, err := c.bios(ctx)
	if err != nil {
		return nil, err
	}
	out := &BIOS{Registry: clean(b.Registry, 128), Attributes: scalars(b.Attributes)}
	target, err := biosSettingsPath(p, b.Settings.SettingsObject.ID)
	if err != nil {
		return out, nil // no settings object: nothing pending that can be read
	}
	out.SettingsObject = clean(target, 512)
	var pending struct {
		Attributes map[string]json.RawMessage `json:"Attributes"`
	}
	if _, err := c.getJSON(ctx, target, &pending); err != nil {
		if StatusOf(err) != http.StatusNotFound {
			return nil, err
		}
	}
	if len(pending.Attributes) <= maxAttributes {
		for k, v := range pending.Attributes {
			if cur, ok := b.Attributes[k]; !ok || !jsonEqual(cur, v) {
				if out.Pending == nil {
					out.Pending = map[string]any{}
				}
				if val, ok := scalar(v); ok {
					out.Pending[clean(k, 128)] = val
				}
			}
		}
	}
	return out, nil
}

// SetBIOS stages BIOS attribute changes (PATCH of the pending settings);
// they apply at the system's next reset. Every name must be an attribute
// the BIOS reports, every value a string, number, boolean or null.
func (c *Client) SetBIOS(ctx context.Context, attrs map[string]any) error {
	if len(attrs) == 0 {
		return errors.New("redfish: no BIOS attributes to set")
	}
	p, b, err := c.bios(ctx)
	if err != nil {
		return err
	}
	target, err := biosSettingsPath(p, b.Settings.SettingsObject.ID)
	if err != nil {
		return err
	}
	for k, v := range attrs {
		if _, ok := b.Attributes[k]; !ok {
			return fmt.Errorf("redfish: the BIOS has no attribute %s", printable(k))
		}
		switch v.(type) {
		case string, bool, float64, int, int64, json.Number, nil:
		default:
			return fmt.Errorf("redfish: BIOS attribute %s: value must be a string, number, boolean or null", printable(k))
		}
	}
	body := map[string]any{"Attributes": attrs}
	if at := settingsApplyTime(b.Settings.ApplyTimes); at != nil {
		body["@Redfish.SettingsApplyTime"] = at
	}
	enc, err := json.Marshal(body)
	if err != nil {
		return err
	}
	r, err := c.get(ctx, target)
	etag := ""
	if err == nil {
		etag = etagOf(r)
	}
	return c.patch(ctx, target, etag, enc)
}

// scalars keeps the attributes whose values are strings, numbers, booleans
// or null (the only kinds a BIOS attribute has).
func scalars(in map[string]json.RawMessage) map[string]any {
	out := make(map[string]any, len(in))
	for k, v := range in {
		if val, ok := scalar(v); ok {
			out[clean(k, 128)] = val
		}
	}
	return out
}

func scalar(raw json.RawMessage) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	switch x := v.(type) {
	case string:
		return clean(x, 1024), true
	case json.Number:
		// A number beyond float64 (1e999) is no BIOS value, and would make
		// the result unreadable to most JSON consumers.
		if f, err := x.Float64(); err != nil || math.IsInf(f, 0) {
			return nil, false
		}
		return x, true
	case bool, nil:
		return x, true
	}
	return nil, false
}

func jsonEqual(a, b json.RawMessage) bool {
	va, oka := scalar(a)
	vb, okb := scalar(b)
	return oka && okb && va == vb
}
