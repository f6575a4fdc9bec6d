package xid

import "fmt"

// Action is what to do about a GPU after an Xid, as NVIDIA's Xid
// documentation recommends it (its "resolution buckets"), from the least
// to the most disruptive.
type Action string

// The actions, worded for an operator.
const (
	// ActionNone: nothing to do on the GPU; the driver has handled it.
	ActionNone Action = "none"
	// ActionRestartApp: the application hit a fault of its own (often a
	// bug); restart it. The GPU itself stays usable.
	ActionRestartApp Action = "restart the application"
	// ActionReset: reset the GPU (nvidia-smi -r, or bcd's gpu.reset) once
	// no work is on it.
	ActionReset Action = "reset the GPU"
	// ActionReboot: reboot the node; a GPU reset is not enough.
	ActionReboot Action = "reboot the node"
	// ActionDrain: take the node out of service, then reset or reboot and
	// run the field diagnostic before it returns.
	ActionDrain Action = "drain the node, then reset and run the field diagnostic"
	// ActionCheckHardware: check the slot, riser, power and cooling of the
	// GPU, then reboot; if it repeats, contact support (RMA).
	ActionCheckHardware Action = "check the GPU's seating, power and cooling, then reboot; contact support (RMA) if it repeats"
	// ActionSupport: the GPU needs service; contact support (RMA).
	ActionSupport Action = "contact support (RMA)"
)

// Severity is how an Xid counts in the GPU's health: a warning leaves the
// GPU usable, a failure takes it out of service until the action is done.
type Severity int

// Severities.
const (
	Warn Severity = iota + 1
	Fail
)

// Info is what bcd knows of one Xid: what NVIDIA's documentation says it
// means, what it recommends, and how it counts.
type Info struct {
	Code     int
	Meaning  string
	Action   Action
	Severity Severity
}

// table holds the Xids a fleet operator acts on, with NVIDIA's documented
// meaning and recommended action in bcd's own words. Codes not listed are
// still reported (Lookup), as unknown.
var table = map[int]Info{
	8:   {Meaning: "the GPU stopped processing (an engine timed out)", Action: ActionRestartApp, Severity: Warn},
	13:  {Meaning: "graphics engine exception (usually the application: an out-of-range access or illegal instruction)", Action: ActionRestartApp, Severity: Warn},
	31:  {Meaning: "GPU memory page fault (usually the application accessing an address it does not own)", Action: ActionRestartApp, Severity: Warn},
	32:  {Meaning: "invalid or corrupted push buffer stream (the host's memory or the PCIe path may be at fault)", Action: ActionRestartApp, Severity: Warn},
	38:  {Meaning: "driver firmware error", Action: ActionReset, Severity: Fail},
	43:  {Meaning: "the GPU stopped a channel that hit a fault (the application's)", Action: ActionRestartApp, Severity: Warn},
	45:  {Meaning: "preemptive cleanup: the driver ended work after an earlier error", Action: ActionNone, Severity: Warn},
	48:  {Meaning: "double-bit (uncorrectable) ECC error in GPU memory", Action: ActionReset, Severity: Fail},
	56:  {Meaning: "display engine error", Action: ActionReset, Severity: Fail},
	57:  {Meaning: "error programming video memory interface", Action: ActionReset, Severity: Fail},
	61:  {Meaning: "internal micro-controller breakpoint or warning", Action: ActionReset, Severity: Fail},
	62:  {Meaning: "internal micro-controller halted", Action: ActionReset, Severity: Fail},
	63:  {Meaning: "a page retirement or row remap was recorded and takes effect at the next reset", Action: ActionReset, Severity: Warn},
	64:  {Meaning: "a page retirement or row remap failed", Action: ActionReset, Severity: Fail},
	68:  {Meaning: "video decoder (NVDEC) exception", Action: ActionRestartApp, Severity: Warn},
	69:  {Meaning: "graphics engine class error", Action: ActionRestartApp, Severity: Warn},
	74:  {Meaning: "NVLink error", Action: ActionReset, Severity: Fail},
	79:  {Meaning: "the GPU has fallen off the bus", Action: ActionCheckHardware, Severity: Fail},
	92:  {Meaning: "high rate of single-bit (corrected) ECC errors", Action: ActionNone, Severity: Warn},
	94:  {Meaning: "contained uncorrectable ECC error: only the application that touched the memory was affected", Action: ActionRestartApp, Severity: Warn},
	95:  {Meaning: "uncontained uncorrectable ECC error: every application on the GPU is affected", Action: ActionReset, Severity: Fail},
	109: {Meaning: "context switch timeout", Action: ActionRestartApp, Severity: Warn},
	119: {Meaning: "the GPU's system processor (GSP) did not answer the driver in time", Action: ActionReset, Severity: Fail},
	120: {Meaning: "GPU system processor (GSP) error", Action: ActionReset, Severity: Fail},
	121: {Meaning: "C2C (CPU to GPU) link error", Action: ActionReset, Severity: Fail},
	140: {Meaning: "unrecovered ECC error in GPU memory", Action: ActionReset, Severity: Fail},
	143: {Meaning: "the GPU's system processor (GSP) failed to initialise", Action: ActionReboot, Severity: Fail},
	144: {Meaning: "NVLink error (SAW)", Action: ActionReset, Severity: Fail},
	145: {Meaning: "NVLink error (RLW)", Action: ActionReset, Severity: Fail},
	146: {Meaning: "NVLink error (TLW)", Action: ActionReset, Severity: Fail},
	147: {Meaning: "NVLink error (TREX)", Action: ActionReset, Severity: Fail},
	148: {Meaning: "NVLink error (NVLPW)", Action: ActionReset, Severity: Fail},
	149: {Meaning: "NVLink error (NETIR)", Action: ActionReset, Severity: Fail},
	150: {Meaning: "NVLink error (MSE)", Action: ActionReset, Severity: Fail},
	154: {Meaning: "the driver changed the GPU's recovery action (see the GPU's recovery action)", Action: ActionReset, Severity: Fail},
}

// Lookup returns what bcd knows of code. An Xid not in its table comes back
// with known false, a generic meaning pointing at NVIDIA's catalog, and
// counts as a warning: it is reported, never dropped, but bcd does not
// guess an action for it.
func Lookup(code int) (info Info, known bool) {
	info, known = table[code]
	info.Code = code
	if !known {
		info.Meaning = fmt.Sprintf("Xid %d is not in bcd's table; see NVIDIA's Xid catalog", code)
		info.Action = ActionNone
		info.Severity = Warn
	}
	return info, known
}

// Describe is one line for an operator: "Xid 79: the GPU has fallen off
// the bus; action: check …".
func (i Info) Describe() string {
	return fmt.Sprintf("Xid %d: %s; action: %s", i.Code, i.Meaning, i.Action)
}
