package gateway_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// Two gateways on one database signing SSH user certificates at once
// never issue one serial twice (the KRL revokes by serial), and a serial
// counted by an earlier release in a gateway's data directory is not
// issued again.
func TestSSHSerialsAcrossGateways(t *testing.T) {
	g1, g2 := twoGateways(t, gateway.Config{})
	if err := os.WriteFile(filepath.Join(g2.dir, "ssh-serial"), []byte("50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	line := string(ssh.MarshalAuthorizedKey(sp))
	const n = 16
	var mu sync.Mutex
	seen := map[uint64]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := g1
			if i%2 == 1 {
				g = g2
			}
			v, err := g.s.SSHSign(adminapi.SSHSignRequest{Principal: "node_a:ops", PublicKey: line})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			seen[v.Serial]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("%d distinct serials of %d certificates: %v", len(seen), n, seen)
	}
	for s := range seen {
		if s <= 50 {
			t.Errorf("serial %d issued again (the data directory counted to 50)", s)
		}
	}
}
