package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/gateway"
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
	var h gateway.HealthView
	if err := json.Unmarshal([]byte(out), &h); code != 0 || err != nil || h.Database.Backend != "bbolt" || !h.Database.Reachable {
		t.Fatalf("health --json: exit %d %v %+v", code, err, h)
	}
}
