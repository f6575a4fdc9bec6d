// Package keys is a gateway's long-lived keys: the serving and node CAs,
// the join signing and encryption keys, the workload, command-signing,
// SSH user CA and ticket-signing keys. On bbolt each is a file in the
// data directory, made when first needed; with a database the fleet's
// gateways share one set, stored there sealed under the key-encryption
// key (package kek).
package keys
