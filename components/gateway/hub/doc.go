// Package hub is the gateway's register of live agent sessions: one per
// node, each with the queue of frames its send loop writes. The agent
// service registers sessions; the fleet logic pushes commands, spec
// changes, cancels, revocations and drains to them through it (as
// headscale's notifier does for its control server).
package hub
