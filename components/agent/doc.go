// Package agent is what every agent role runs (node, site, ramdisk): it
// loads the joined identity, dials the gateway with mTLS and runs the
// session with the role's table of command kinds.
//
// The agent domain is the spine every agent role runs, in the packages
// below this one: transport (the pinned HTTP/2 client), session (the one
// stream to the gateway), dispatch (commands accepted, checked and run
// exactly once), journal (the fsynced record behind it), clock (the
// working clock), renew (certificates at 60% of their life), status (the
// local status socket and `bcd status`), hostinfo (boot id, hostname and
// machine ids), converge (desired state: the held NodeSpec and its
// sections), report (StatusReports, heartbeat fields) and agentcmd (`bcd
// join` and the agent modes a role's main picks).
//
// It may import base, trust and helper; what a role knows about its
// machine reaches it from above, through agentcmd.Machine.
package agent
