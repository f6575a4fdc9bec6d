// Package components holds bcd's building blocks, grouped by domain, one
// folder each. A role binary (roles/<role>) and bcgw (cmd/bcgw) compose
// them; no component imports a role, a command or a test tier.
//
// The domains, and what each may import besides itself (layers_test.go
// enforces it with go list; docs/architecture.md draws it):
//
//	base     config, cli, logging, buildinfo, atomicfile, backoff, roles: nothing of ours
//	trust    keys, certificates, the TPM, identity, join, the well-known document: base
//	bcx      the driver-plugin host and its test BMC: base
//	helper   bcd helper (the root half), its wire, file table and clients: base, trust
//	agent    the spine every agent role runs: base, trust, helper
//	machine  what a node knows and does about its own hardware: base, trust, helper, agent
//	boot     the site's boot server and its kinds: base, trust, agent
//	bmc      Redfish and the bmc.* kinds: base, trust, agent, bcx
//	disk     the ramdisk's disk work and its agent mode: base, trust, helper, agent, machine, boot
//	gateway  bcgw's server side: base, trust, boot
//	vm       tenants' VMs: the instances section, images, seeds, runtimes: base, trust, helper, agent
//	host     the host section: config units and their section: base, trust, helper, agent
//
// Only the generated protocol (proto/gen) is shared by every domain.
package components
