package update

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/release"
)

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
