package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	relmanifest "github.com/better-compute/bcd/components/trust/release"
)

// TestHealth: `bcgw health` prints the gateway's sessions and database,
// and --json the same view (the unreachable view is tested in
// components/gateway's TestDatabaseLostIsShown).
func TestHealth(t *testing.T) {
	_, dir := startServer(t)
	code, out, errOut := runCLI(t, context.Background(), "", "health", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "database  bbolt answers (since ") || !strings.Contains(out, "0 sessions") {
		t.Fatalf("health: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, context.Background(), "", "health", "--json", "--data-dir", dir)
	var h adminapi.HealthView
	if err := json.Unmarshal([]byte(out), &h); code != 0 || err != nil || h.Database.Backend != "bbolt" || !h.Database.Reachable {
		t.Fatalf("health --json: exit %d %v %+v", code, err, h)
	}
}

// TestReleaseListAndExpiry: bcgw release publish through the admin API,
// then bcgw release list shows it with its expiry; a release expiring
// within a week is warned about on publish and on list.
func TestReleaseListAndExpiry(t *testing.T) {
	_, dir := startServer(t)
	bin := filepath.Join(t.TempDir(), "bcd-node")
	os.WriteFile(bin, []byte("bcd 0.2.0"), 0o755)
	sum := sha256.Sum256([]byte("bcd 0.2.0"))
	hexSum := hex.EncodeToString(sum[:])
	expires := time.Now().Add(49 * time.Hour).UTC().Truncate(time.Second)
	doc, err := relmanifest.Encode(relmanifest.Manifest{Type: relmanifest.Type, Version: "0.2.0", Sequence: 2, Expires: expires,
		Artifacts: []relmanifest.Artifact{{Role: "node", Arch: "amd64", Size: 9, SHA256: hexSum, URL: "https://bcgw.lab/releases/" + hexSum}}})
	if err != nil {
		t.Fatal(err)
	}
	docFile := filepath.Join(t.TempDir(), "r.json")
	os.WriteFile(docFile, doc, 0o644)
	ctx := context.Background()
	code, out, errOut := runCLI(t, ctx, "", "release", "publish", docFile, "--artifact", bin, "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "published release 0.2.0 (sequence 2): served by this gateway node/amd64") ||
		!strings.Contains(errOut, "warning: release 0.2.0 expires in 4") {
		t.Fatalf("publish: exit %d\n%q\n%q", code, out, errOut)
	}
	code, out, errOut = runCLI(t, ctx, "", "release", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "0.2.0    2         "+expires.Format(time.RFC3339)+"  node/amd64") || !strings.Contains(errOut, "expires in") {
		t.Fatalf("list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, ctx, "", "release", "list", "--json", "--data-dir", dir)
	var rs []adminapi.ReleaseView
	if err := json.Unmarshal([]byte(out), &rs); code != 0 || err != nil || len(rs) != 1 || rs[0].Expired || !rs[0].Expires.Equal(expires) {
		t.Fatalf("list --json: exit %d %v %+v", code, err, rs)
	}
	if w := expiryWarning("0.1.0", expires, expires.Add(time.Second)); !strings.Contains(w, "expired at") {
		t.Errorf("an expired release: %q", w)
	}
	if w := expiryWarning("0.1.0", expires, expires.Add(-8*24*time.Hour)); w != "" {
		t.Errorf("a release expiring in 8 days: %q", w)
	}
}
