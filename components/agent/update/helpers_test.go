package update

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/release"
)

// runFor bounds a test's run of the kind or the section: a check that
// lets a release through makes the kind install it and wait for a restart
// that never comes, which must fail in seconds, not at go test's timeout.
const runFor = 20 * time.Second

// bounded is ctx, cancelled after runFor or when the test ends.
func bounded(t testing.TB, ctx context.Context) context.Context {
	ctx, cancel := context.WithTimeout(ctx, runFor)
	t.Cleanup(cancel)
	return ctx
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// upgrade installs a release of version whose binary is "bcd VERSION".
func upgrade(t *testing.T, s *Slots, version string, seq uint64) (Upgrade, error) {
	t.Helper()
	bin := []byte("bcd " + version)
	sum := sha256.Sum256(bin)
	a := release.Artifact{Role: "node", Arch: "amd64", Size: int64(len(bin)), SHA256: hex.EncodeToString(sum[:]), URL: "https://r.example/" + version}
	return s.Install(bytes.NewReader(bin), release.Manifest{Type: release.Type, Version: version, Sequence: seq}, a)
}
