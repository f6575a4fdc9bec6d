// Package vm groups what a node needs to run tenants' virtual machines,
// one package per concern: spec (the NodeSpec's instances section),
// qcow2 (image headers read in Go, never by a tool), seed (the NoCloud
// cidata volume), images (base images fetched over https and kept by
// digest), vmruntime (the Runtime interface and its shared test suite
// runtimetest), fakeruntime (the file-backed runtime of fakehw builds)
// and domainxml (the libvirt domain bcd helper will render from a typed
// request). docs/instances.md describes them.
//
// It may import base, trust, helper and agent (the section's strict
// decoding is the converge engine's); never machine, boot, disk, bmc or
// the gateway. The site and the ramdisk never link it (roles/deps_test.go).
package vm
