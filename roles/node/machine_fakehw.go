//go:build fakehw

package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/better-compute/bcd/components/agentcmd"
	"github.com/better-compute/bcd/components/cli"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/fakehw"
	"github.com/better-compute/bcd/components/fakekinds"
	"github.com/better-compute/bcd/components/nodekinds"
)

// hardware is the fake machine of BCD_FAKEHW_SEED (default 1).
func hardware(dataDir string) (nodekinds.Hardware, string) {
	seed := int64(1)
	if v := os.Getenv("BCD_FAKEHW_SEED"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			seed = n
		}
	}
	return fakehw.Hardware{Seed: seed, DataDir: dataDir}, "fakehw"
}

// uploadClient trusts, besides the system roots, the CA in the PEM file
// BCD_FAKEHW_UPLOAD_CA, so a test can receive logs.collect uploads.
func uploadClient() *http.Client {
	f := os.Getenv("BCD_FAKEHW_UPLOAD_CA")
	if f == "" {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if b, err := os.ReadFile(f); err == nil {
		pool.AppendCertsFromPEM(b)
	}
	return &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// extraKinds are the test kinds of a fakehw build.
func extraKinds(dataDir string) []dispatch.Kind { return fakekinds.Kinds(dataDir) }

// fakeCommands are the commands only a fakehw build has.
func fakeCommands() []cli.Command {
	return []cli.Command{agentcmd.Sim(func(dataDir string, seed int64) agentcmd.Machine {
		hw := fakehw.Hardware{Seed: seed, DataDir: dataDir}
		return agentcmd.Machine{Kinds: append(nodekinds.Kinds(hw, nil), fakekinds.Kinds(dataDir)...), StatusGPUs: nodekinds.StatusGPUs(hw)}
	})}
}
