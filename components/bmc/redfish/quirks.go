package redfish

// Vendor quirks, kept in this one file. Each is a departure from the plain
// reading of the Redfish specification that some BMCs need; the rest of the
// package is written against the specification.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// rootNeedsAuth: some BMCs answer 401 for the service root although it
// should be readable without credentials. The client then uses the
// standard paths under /redfish/v1.
func rootNeedsAuth(err error) bool {
	s := StatusOf(err)
	return s == http.StatusUnauthorized || s == http.StatusForbidden
}

// credentialsRefused: a session POST answered 400, 401 or 403 with the
// credentials in it means the BMC refused them. Trying basic
// authentication after that would only count towards a lockout.
func credentialsRefused(err error) bool {
	s := StatusOf(err)
	return s == http.StatusUnauthorized || s == http.StatusForbidden
}

// sessionsUnsupported: BMCs without a session service answer the POST with
// 404, 405 or 501; some answer 500 or 503 when their session table is
// full. Those fall back to basic authentication.
func sessionsUnsupported(err error) bool {
	switch StatusOf(err) {
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented,
		http.StatusInternalServerError, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// resetCandidates are the ResetTypes tried, in order, for each action. A
// system that advertises allowable values gets the first it allows (a few
// lack On and take ForceOn). A cycle is PowerCycle or nothing here: a
// system that does not allow it is turned off, waited for and turned on
// (SetPower), never warm-restarted with ForceRestart, which leaves the
// power on and so does not reset what a power cycle resets.
var resetCandidates = map[string][]string{
	PowerOn:    {"On", "ForceOn"},
	PowerOff:   {"ForceOff", "GracefulShutdown"},
	PowerCycle: {"PowerCycle"},
}

// errNoPowerCycle is resetTypeFor's answer for a cycle the system does not
// allow as one ResetType.
var errNoPowerCycle = errors.New("redfish: the system does not allow PowerCycle")

// resetTypeFor picks the ResetType for action given the power state and the
// allowable values ("" when none were advertised). It returns "" when no
// reset is needed: on when already On, off when already Off (several BMCs
// answer an error for those). cycle of a system that is Off turns it on.
func resetTypeFor(action, state string, allowed []string) (string, error) {
	switch {
	case action == PowerOn && state == "On", action == PowerOff && state == "Off":
		return "", nil
	case action == PowerCycle && state == "Off":
		action = PowerOn
	}
	cands := resetCandidates[action]
	if len(allowed) == 0 {
		return cands[0], nil
	}
	for _, c := range cands {
		if slices.Contains(allowed, c) {
			return c, nil
		}
	}
	if action == PowerOn && state != "On" && slices.Contains(allowed, "PushPowerButton") {
		return "PushPowerButton", nil
	}
	if action == PowerCycle {
		return "", errNoPowerCycle
	}
	shown := make([]string, 0, len(allowed))
	for i, a := range allowed {
		if i == 12 {
			break
		}
		shown = append(shown, clean(a, 32))
	}
	return "", fmt.Errorf("redfish: the system allows none of %s for %s (it allows %s)",
		strings.Join(cands, ", "), action, strings.Join(shown, ", "))
}

// defaultResetTarget: a system without a Reset action in Actions still
// answers the standard target on the BMCs that omit it.
func defaultResetTarget(system string) string {
	return system + "/Actions/ComputerSystem.Reset"
}

// resetTypesFromActionInfo: some BMCs list the allowable ResetTypes in an
// ActionInfo resource rather than inline. Unreadable means none advertised.
func (c *Client) resetTypesFromActionInfo(ctx context.Context, info string) []string {
	var ai struct {
		Parameters []struct {
			Name    string   `json:"Name"`
			Allowed []string `json:"AllowableValues"`
		} `json:"Parameters"`
	}
	if _, err := c.getJSON(ctx, info, &ai); err != nil {
		return nil
	}
	for _, p := range ai.Parameters {
		if p.Name == "ResetType" {
			return p.Allowed
		}
	}
	return nil
}

// patch sends a PATCH with If-Match when the resource carried an ETag
// (several BMCs refuse a PATCH without it). On 412 (the resource changed
// meanwhile) or 428 (an ETag is required but the GET showed none) it reads
// the ETag again and retries once; on 428 with still no ETag it sends
// If-Match: *.
func (c *Client) patch(ctx context.Context, target, etag string, body []byte) error {
	if err := c.login(ctx); err != nil {
		return err
	}
	send := func(etag string) error {
		var hdr http.Header
		if etag != "" {
			hdr = http.Header{"If-Match": {etag}}
		}
		_, err := c.do(ctx, http.MethodPatch, target, body, hdr, true)
		return err
	}
	err := send(etag)
	switch StatusOf(err) {
	case http.StatusPreconditionFailed, http.StatusPreconditionRequired:
		r, gerr := c.get(ctx, target)
		if gerr != nil {
			return err
		}
		fresh := etagOf(r)
		if fresh == "" {
			fresh = "*"
		}
		return send(fresh)
	}
	return err
}

// mediaAction inserts or ejects through the VirtualMedia action the slot
// advertises. A slot that advertises none (the DMTF mockups, some BMCs)
// gets the standard action path and, when that answers 404 or 405 (BMCs
// that predate the actions), a PATCH of Image and Inserted. A BMC that
// refuses the optional Inserted and WriteProtected parameters (400) gets
// the insert again with Image alone. An advertised action that answers 404
// or 405 is returned as such: the caller passes on to the next slot.
func (c *Client) mediaAction(ctx context.Context, vm *virtualMedia, insert bool, image string) error {
	action, name := vm.Actions.Eject.Target, "EjectMedia"
	var body map[string]any
	if insert {
		action, name = vm.Actions.Insert.Target, "InsertMedia"
		body = map[string]any{"Image": image, "Inserted": true, "WriteProtected": true}
	} else {
		body = map[string]any{}
	}
	advertised := action != ""
	if !advertised {
		action = vm.path + "/Actions/VirtualMedia." + name
	}
	_, err := c.post(ctx, action, body)
	if insert && StatusOf(err) == http.StatusBadRequest {
		_, err = c.post(ctx, action, map[string]any{"Image": image})
	}
	if !advertised && notThere(err) {
		patch := []byte(`{"Image":null,"Inserted":false}`)
		if insert {
			patch, err = json.Marshal(map[string]any{"Image": image, "Inserted": true})
			if err != nil {
				return err
			}
		}
		return c.patch(ctx, vm.path, vm.etag, patch)
	}
	return err
}

// settingsApplyTime: a BIOS whose @Redfish.Settings lists
// SupportedApplyTimes gets "@Redfish.SettingsApplyTime" (OnReset when
// offered) in the PATCH; BMCs that list none reject the property, so it is
// sent only when listed.
func settingsApplyTime(supported []string) map[string]string {
	for _, t := range []string{"OnReset", "AtMaintenanceWindowStart", "Immediate"} {
		if slices.Contains(supported, t) {
			return map[string]string{"ApplyTime": t}
		}
	}
	return nil
}

// biosSettingsPath: the pending-settings resource is the one
// @Redfish.Settings.SettingsObject names (Dell: Bios/Settings, AMI:
// Bios/SD, HPE: bios/settings/). A BIOS that names none takes no staged
// settings through this client: a guessed path could be another resource.
func biosSettingsPath(bios, settingsObject string) (string, error) {
	if settingsObject == "" {
		return "", fmt.Errorf("redfish: the BIOS at %s names no @Redfish.Settings.SettingsObject, so it has no pending settings to read or PATCH (this client does not guess the path)", printable(bios))
	}
	return settingsObject, nil
}
