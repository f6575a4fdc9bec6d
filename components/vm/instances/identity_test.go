package instances

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

// TestHostKey: OpenSSH's ssh-keygen reads the private key hostKey writes
// and derives from it the public key it gave; two keys differ.
func TestHostKey(t *testing.T) {
	keygen := testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	priv, pub, err := hostKey()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(priv), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(keygen, "-y", "-f", p).CombinedOutput()
	if err != nil || strings.Fields(string(out))[1] != strings.Fields(pub)[1] {
		t.Fatalf("ssh-keygen -y: %v: %s; want %s", err, out, pub)
	}
	if _, pub2, _ := hostKey(); pub2 == pub {
		t.Error("two host keys are the same")
	}
}
