// Package gateway is bcgw's server: Config, New and Run, which open the
// store and the keys and wire the packages below it, one concern each:
// agentsvc (the AgentGateway service agents dial), admin (the admin API
// on the data directory's socket and the loopback port), fleet (the fleet
// logic both call), hub (the live sessions), keys, store and kek. The
// admin API's bodies and client are adminapi. Imports go one way:
// gateway -> admin -> agentsvc -> fleet -> hub, keys, store
// (docs/decisions.md).
//
// The gateway domain is bcgw's alone: these packages may import base,
// trust and boot (the boot lease it grants); no agent role links them
// (roles/deps_test.go).
package gateway
