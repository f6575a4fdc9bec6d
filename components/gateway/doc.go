// Package gateway is the server side of bcgw, the lab gateway and minimal
// control plane: the AgentGateway service (Join, Renew, Session), the
// well-known document and the admin API its CLI and the tests use. All
// state lives in one data directory.
//
// The gateway domain is bcgw's alone: this package and its store. It may
// import base, trust and boot (the boot lease it grants); no agent role
// links it (roles/deps_test.go).
package gateway
