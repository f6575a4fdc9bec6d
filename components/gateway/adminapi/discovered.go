package adminapi

import (
	"encoding/json"
	"net"
	"time"
)

// DiscoveredView is one machine a site saw asking to boot that nobody
// prepared, as `bcgw discovered SITE` shows it.
type DiscoveredView struct {
	MAC       string    `json:"mac"`
	Arch      string    `json:"arch,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	Count     int       `json:"count"`
}

// maxDiscovered bounds what is read of a site's list.
const maxDiscovered = 1024

// knownArch are the architectures a site's proxy DHCP names.
var knownArch = map[string]bool{"": true, "bios": true, "uefi-x86-64": true, "uefi-arm64": true}

// Discovered reads the "discovered" section of a site's report (the
// site wrote it, so bcgw trusts none of it): only well-formed entries
// are kept (a 6-byte MAC, a known architecture, times in order and not
// after the report, a positive count); dropped counts the others.
func Discovered(report json.RawMessage, reportAt time.Time) (out []DiscoveredView, dropped int) {
	var sections struct {
		Discovered []json.RawMessage `json:"discovered"`
	}
	if len(report) == 0 || json.Unmarshal(report, &sections) != nil {
		return nil, 0
	}
	for i, raw := range sections.Discovered {
		if i >= maxDiscovered {
			dropped += len(sections.Discovered) - i
			break
		}
		var d DiscoveredView
		if json.Unmarshal(raw, &d) != nil {
			dropped++
			continue
		}
		mac, err := net.ParseMAC(d.MAC)
		switch {
		case err != nil || len(mac) != 6 || mac.String() != d.MAC,
			!knownArch[d.Arch],
			d.Count < 1 || d.FirstSeen.IsZero() || d.LastSeen.Before(d.FirstSeen),
			!reportAt.IsZero() && d.LastSeen.After(reportAt.Add(time.Minute)):
			dropped++
			continue
		}
		out = append(out, d)
	}
	return out, dropped
}
