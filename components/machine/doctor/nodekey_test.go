package doctor

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/tpm/nodetpm"
	"github.com/better-compute/bcd/components/trust/tpm/swtpmtest"
)

// joinedInTPM writes an identity whose key is a node key in a real swtpm.
func joinedInTPM(t *testing.T, dir string) {
	t.Helper()
	sw := swtpmtest.Start(t, "")
	tp, err := nodetpm.OpenTCP(sw.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	key, err := tp.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.NewCA("doctor test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueClient(key.Public(), "node_01k5w", pki.SPIFFEID("bcgw.lab", "node", "node_01k5w"), "fsn1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := identity.Save(dir, key, cert, identity.Identity{NodeID: "node_01k5w", Site: "fsn1", Role: "node"}); err != nil {
		t.Fatal(err)
	}
}

func TestNodeKeyCheck(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, dir string)
		hasTPM bool
		want   want
	}{
		{"not joined", func(*testing.T, string) {}, true, want{status: OK, detail: "none yet: this node has not joined"}},
		{"file key, no TPM", func(t *testing.T, d string) { joined(t, d, time.Now().Add(time.Hour)) }, false,
			want{status: OK, detail: "a file (this host has no TPM)"}},
		{"file key, host has a TPM", func(t *testing.T, d string) { joined(t, d, time.Now().Add(time.Hour)) }, true,
			want{status: Warn, detail: fileKeyWithTPM}},
		{"key in the TPM", joinedInTPM, true, want{status: OK, detail: "in the TPM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			tt.want.check(t, NodeKey(dir, tt.hasTPM).Run(context.Background()), "node key")
		})
	}
}
