// Package helper is bcd helper, the root half of privilege separation: it
// serves an unprivileged bcd node a few typed operations on a local unix
// socket ([helper] socket) and trusts nothing in them. Each connection is
// checked (SO_PEERCRED: the [helper] user or root; /proc/PID/exe: this
// helper's own binary or [helper] entrypoint), carries one request of the
// wire package's protocol, and is logged. Files are written only through
// the filetable package's kinds and ids, never a path, and a GPU hold's
// CDI spec or environment file only in the shape cdispec checks, with
// device nodes of this host's own GPUs (holdfile_linux.go); a firewall
// ruleset only in the shape of bcd's three nftables tables; a GPU reset
// only for a GPU nvidia-smi lists on this host; a systemd slice only
// named bcd-alloc-<id>.slice, with cpulists bounded by the host's CPUs
// and memory nodes. The operations are one table (ops_linux.go).
//
// It links no network, RPC or protobuf code: roles/deps_test.go checks the
// helper role never links net/http, connect, protobuf or gRPC.
//
// The helper domain is this package (the server) and, below it, wire
// (the protocol both sides speak), filetable (kinds and ids to paths),
// cdispec (a GPU hold's files, rendered and checked), helperclient (the
// node's side) and helpertpm (the node's TPM through the helper). It may
// import base and trust; the agent and machine domains use its clients.
package helper
