// Package e2e runs the built binaries as real processes over real mTLS on
// loopback: bcgw serve, bcd join, bcd node, and the bcgw admin CLI.
package e2e
