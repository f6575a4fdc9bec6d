// Package proto holds the .proto files of the agent protocol; the Go
// generated from them is in proto/gen (make proto), and a test checks
// that it is current.
package proto
