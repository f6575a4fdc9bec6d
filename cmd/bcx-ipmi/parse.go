package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/better-compute/bcd/components/bcx"
)

// What ipmitool prints comes from the BMC: every parser here bounds what
// it keeps and drops control characters.

const (
	maxFields  = 256
	maxSensors = 512
)

type field struct{ key, value string }

// parseFields reads "Key : value" lines (mc info, fru print, mc guid).
// Lines without a colon, or with an empty key, are skipped.
func parseFields(out string) []field {
	var fs []field
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(line, ":")
		k, v = printable(strings.TrimSpace(k), 64), printable(strings.TrimSpace(v), 256)
		if !ok || k == "" {
			continue
		}
		if len(fs) == maxFields {
			break
		}
		fs = append(fs, field{k, v})
	}
	return fs
}

// parsePower reads "Chassis Power is on|off".
func parsePower(out string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		switch strings.TrimSpace(line) {
		case "Chassis Power is on":
			return "On", nil
		case "Chassis Power is off":
			return "Off", nil
		}
	}
	return "", fmt.Errorf("chassis power status: %w", errUnexpected)
}

var bootTargets = []struct{ selector, target string }{
	{"Force PXE", "Pxe"},
	{"Force Boot from default Hard-Drive", "Hdd"},
	{"Force Boot from CD/DVD", "Cd"},
	{"Force Boot into BIOS Setup", "BiosSetup"},
	{"Force Boot from Floppy/primary removable media", "Floppy"},
	{"No override", "None"},
}

// parseBootFlags reads the boot device and its persistence from
// "chassis bootparam get 5".
func parseBootFlags(out string) (target, enabled string, err error) {
	for _, line := range strings.Split(out, "\n") {
		l := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "-"))
		switch {
		case l == "Options apply to only next boot":
			enabled = "Once"
		case l == "Options apply to all future boots":
			enabled = "Continuous"
		case strings.HasPrefix(l, "Boot Device Selector :"):
			sel := strings.TrimSpace(strings.TrimPrefix(l, "Boot Device Selector :"))
			target = "Other"
			for _, b := range bootTargets {
				if sel == b.selector {
					target = b.target
				}
			}
		}
	}
	if target == "" || enabled == "" {
		return "", "", fmt.Errorf("chassis bootparam get 5: %w", errUnexpected)
	}
	return target, enabled, nil
}

var uuidRe = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// parseUUID checks the GUID ipmitool decoded and writes it in lower case.
func parseUUID(s string) (string, bool) {
	if !uuidRe.MatchString(s) {
		return "", false
	}
	return strings.ToLower(s), true
}

// Sensor is one line of "sdr elist".
type Sensor struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Status  string `json:"status"`
	Entity  string `json:"entity"`
	Reading string `json:"reading"`
}

// parseSDR reads "name | id | status | entity | reading" lines.
func parseSDR(out string) []Sensor {
	ss := []Sensor{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "|")
		if len(f) != 5 || len(ss) == maxSensors {
			continue
		}
		for i := range f {
			f[i] = printable(strings.TrimSpace(f[i]), 64)
		}
		if f[0] == "" {
			continue
		}
		ss = append(ss, Sensor{Name: f[0], ID: f[1], Status: f[2], Entity: f[3], Reading: f[4]})
	}
	return ss
}

// printable is bcx.Printable.
func printable(s string, n int) string { return bcx.Printable(s, n) }
