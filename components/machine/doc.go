// Package machine groups what a node knows and does about its own
// hardware: inventory (procfs and sysfs), nvsmi (GPUs through
// nvidia-smi), xid (GPU faults in the kernel log), dcgm (diag.dcgm),
// logbundle (logs.collect), doctor (`bcd doctor`), nodekinds (the node's
// command kinds over a Hardware seam), devices (the NodeSpec's GPU holds),
// pressure (PSI and CPU steal), nodemetrics (the bcd.gpu.* and bcd.host.*
// telemetry sources),
// health (the monitor that turns Xids into conditions and keeps the
// inventory and pressure current for the agent's reports), and fakehw and
// fakekinds (the fake machine, test kinds and the fakehw NodeSpec section
// of fakehw builds).
//
// It may import base, trust, helper and agent (the kinds it offers are
// agent dispatch handlers); never boot, disk, bmc or the gateway.
package machine
