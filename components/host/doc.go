// Package host is the host domain: the NodeSpec's host section, which
// configures the machine a GPU node needs (kernel modules, sysctls, huge
// pages, CPU governor and isolation, the IOMMU, the NVIDIA driver and its
// tools) unit by unit. unit holds the config units over a small System
// seam and is linked by bcd helper, which plans a unit again as root;
// section is the node's converge section over them. docs/host.md
// describes every unit.
package host
