// Package admin is bcgw's admin API: its HTTP handlers (tokens, nodes,
// commands, specs, holds, batches, trust, releases, TPM enrolment, BMC
// credentials, SSH access, tunnels), served on the data directory's unix
// socket and, with --admin-listen, on a loopback port behind a bearer
// token. The bodies and the client are package adminapi; the logic is
// package fleet. A fleet web page would be served here, on the same
// listeners and the same authentication.
package admin
