package gateway_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/release"
)

// A release published through one gateway on the database is served by
// the other (its binary at /releases/<sha256> on the agents' port, its
// document on the admin API for bcgw upgrade), though the other's data
// directory never had it: a node behind HAProxy may download from either.
func TestReleaseServedByEveryGateway(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	bin := []byte("\x7fELF bcd 0.2.0 for the fleet")
	sum := sha256.Sum256(bin)
	hexSum := hex.EncodeToString(sum[:])
	path := filepath.Join(t.TempDir(), "bcd-node")
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	doc, err := release.Encode(release.Manifest{Type: release.Type, Version: "0.2.0", Sequence: 2, Expires: time.Now().Add(time.Hour),
		Artifacts: []release.Artifact{{Role: "node", Arch: "amd64", Size: int64(len(bin)), SHA256: hexSum, URL: "https://bcgw.lab/releases/" + hexSum}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a1 := adminapi.NewClient(g1.dir, "", "")
	up, err := a1.UploadArtifact(ctx, path)
	if err != nil || up != hexSum {
		t.Fatalf("upload = %s, %v", up, err)
	}
	p, err := a1.PublishRelease(ctx, adminapi.PublishRequest{Doc: doc, Artifacts: []string{up}})
	if err != nil || !p.Shared || len(p.Served) != 1 {
		t.Fatalf("publish = %+v, %v", p, err)
	}
	if _, err := os.Stat(filepath.Join(g2.dir, fleet.ReleasesDir)); err == nil {
		t.Fatal("the second gateway's data directory has the release before anyone asked it")
	}
	got, err := adminapi.NewClient(g2.dir, "", "").ReleaseDoc(ctx, "0.2.0")
	if err != nil || string(got) != string(doc) {
		t.Errorf("the document through the second gateway: %v", err)
	}
	_, hc := g2.clientHC(t, nil)
	resp, err := hc.Get(g2.url + adminapi.ReleasePath + hexSum)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != string(bin) {
		t.Errorf("the binary through the second gateway: %d, %d bytes", resp.StatusCode, len(b))
	}
	if _, err := adminapi.NewClient(g2.dir, "", "").ReleaseDoc(ctx, "0.3.0"); err == nil {
		t.Error("a release never published has a document")
	}

	// A binary the first gateway kept from before it shared a database
	// (in its data directory only), named again by a later release without
	// an upload: the second gateway serves it too.
	old := []byte("\x7fELF bcd site 0.1.0, published on bbolt")
	oldSum := sha256.Sum256(old)
	oldHex := hex.EncodeToString(oldSum[:])
	if err := os.WriteFile(filepath.Join(g1.dir, fleet.ReleasesDir, "artifacts", oldHex), old, 0o600); err != nil {
		t.Fatal(err)
	}
	doc3, err := release.Encode(release.Manifest{Type: release.Type, Version: "0.3.1", Sequence: 3, Expires: time.Now().Add(time.Hour),
		Artifacts: []release.Artifact{{Role: "site", Arch: "amd64", Size: int64(len(old)), SHA256: oldHex, URL: "https://bcgw.lab/releases/" + oldHex}}})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := a1.PublishRelease(ctx, adminapi.PublishRequest{Doc: doc3}); err != nil || len(p.Served) != 1 {
		t.Fatalf("publish 0.3.1 = %+v, %v", p, err)
	}
	resp, err = hc.Get(g2.url + adminapi.ReleasePath + oldHex)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != string(old) {
		t.Errorf("the first gateway's kept binary through the second: %d, %d bytes", resp.StatusCode, len(b))
	}

	// A daemon.upgrade sent through one gateway (here as bcgw run would,
	// not bcgw upgrade) is the node's upgrade in its status on the other.
	a := g1.join(t)
	if st, err := adminapi.NewClient(g2.dir, "", "").Status(ctx, a.NodeID); err != nil || st.Upgrade != nil {
		t.Fatalf("status before any upgrade: %+v %v", st.Upgrade, err)
	}
	body, _ := json.Marshal(map[string]json.RawMessage{"release": doc})
	c, err := a1.Send(ctx, adminapi.CommandRequest{Node: a.NodeID, Kind: "daemon.upgrade", Body: body})
	if err != nil {
		t.Fatal(err)
	}
	st, err := adminapi.NewClient(g2.dir, "", "").Status(ctx, a.NodeID)
	if err != nil || st.Upgrade == nil || st.Upgrade.Version != "0.2.0" || st.Upgrade.Command.ID != c.ID || st.Upgrade.Command.State != "pending" {
		t.Errorf("status after the upgrade was sent: %+v %v", st.Upgrade, err)
	}
}

// A node's latest upgrade is the one sent last, whichever gateway records
// it last: an earlier daemon.upgrade recorded after a later one (two
// gateways sending at once) does not replace it.
func TestLatestUpgradeKeepsTheLater(t *testing.T) {
	g := startGateway(t, gateway.Config{})
	a := g.join(t)
	c1, err := g.s.SendCommand(a.NodeID, "daemon.upgrade", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	c2, err := g.s.SendCommand(a.NodeID, "daemon.upgrade", nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	older, err := g.s.Store().Command(c1.ID)
	if err != nil {
		t.Fatal(err)
	}
	g.s.NoteUpgrade(older)
	st, err := adminapi.NewClient(g.dir, "", "").Status(context.Background(), a.NodeID)
	if err != nil || st.Upgrade == nil || st.Upgrade.Command.ID != c2.ID {
		t.Fatalf("latest upgrade %+v %v, want %s", st.Upgrade, err, c2.ID)
	}
}
