// Package bmc groups the site's baseboard management: redfish (the
// pinned Redfish client and, in redfishtest, a test BMC) and bmckinds
// (the bmc.* command kinds, over Redfish or a bcx driver plugin such as
// bcx-ipmi).
//
// It may import base, trust, agent and bcx. Only the site role links it.
package bmc
