//go:build linux

package helper

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
)

const testCA = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1UrUbkA/HMG5PYPTtjNljV18Cf8t9kA4v5lsmfZuu2 ca@bcgw"

// accessServer is an opServer whose accounts are alice (1000) and root,
// and whose sshd -t answers what *sshdErr holds.
func accessServer(t *testing.T) (*opServer, *error) {
	testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	var sshdErr error
	o := newOpServer(t, func(s *seams, _ *execLog) {
		s.sshAccount = func(name string) (int, error) {
			switch name {
			case "alice":
				return 1000, nil
			case "root":
				return 0, nil
			}
			return 0, errors.New("unknown user " + name)
		}
		s.sshdTest = func(context.Context) error { return sshdErr }
	})
	return o, &sshdErr
}

func accessReq(body string) string { return `{"v":1,"op":"access.apply","access":` + body + `}` }

func TestAccessApply(t *testing.T) {
	o, sshdErr := accessServer(t)
	good := accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["node-1:alice"]},"revoked_serials":[4]}`)
	wantOK(t, o.call(t, good))
	dropin, err := os.ReadFile(filepath.Join(o.root, "etc/ssh/sshd_config.d/10-better-compute.conf"))
	if err != nil || !strings.Contains(string(dropin), "\nTrustedUserCAKeys "+o.root+"/etc/ssh/bc_ca.pub\n") {
		t.Fatalf("drop-in %q, %v", dropin, err)
	}
	assertFile(t, filepath.Join(o.root, "etc/ssh/bc_principals/alice"), []byte("node-1:alice\n"), 0o644)
	assertFile(t, filepath.Join(o.root, "etc/ssh/bc_ca.pub"), []byte(strings.TrimSuffix(testCA, " ca@bcgw")+"\n"), 0o644)

	// Refusals change nothing on disk.
	before := snapshot(t, o.root, o.root)
	for name, req := range map[string]string{
		"newline in the CA":         accessReq(`{"user_ca":"` + testCA + `\nPermitRootLogin yes"}`),
		"keyword in the CA":         accessReq(`{"user_ca":"` + strings.Replace(testCA, "ca@bcgw", "ForceCommand", 1) + `"}`),
		"newline in a principal":    accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["a\nMatch all"]}}`),
		"keyword as a principal":    accessReq(`{"user_ca":"` + testCA + `","principals":{"alice":["PermitRootLogin"]}}`),
		"principal for root":        accessReq(`{"user_ca":"` + testCA + `","principals":{"root":["node-1:root"]}}`),
		"an unknown account":        accessReq(`{"user_ca":"` + testCA + `","principals":{"mallory":["x"]}}`),
		"drop-in text":              accessReq(`{"user_ca":"` + testCA + `","dropin":"PermitRootLogin yes"}`),
		"a field in another case":   accessReq(`{"User_CA":"` + testCA + `"}`),
		"access that is not object": `{"v":1,"op":"access.apply","access":"x"}`,
	} {
		t.Run(name, func(t *testing.T) {
			r := o.call(t, req)
			if r.OK || r.Retryable {
				t.Fatalf("answer %+v, want a refusal", r)
			}
			sameSnapshot(t, before, snapshot(t, o.root, o.root))
		})
	}

	// sshd -t refusing puts the previous files back.
	*sshdErr = errors.New("sshd -t = exit status 255: line 3: Bad configuration option")
	r := o.call(t, accessReq(`{"user_ca":"`+testCA+`","principals":{"alice":["other"]},"revoked_serials":[4,5]}`))
	wantFailed(t, r, "sshd -t rejected", false)
	sameSnapshot(t, before, snapshot(t, o.root, o.root))

	// An empty section removes every file.
	*sshdErr = nil
	wantOK(t, o.call(t, accessReq(`{}`)))
	for _, p := range []string{"etc/ssh/sshd_config.d/10-better-compute.conf", "etc/ssh/bc_ca.pub", "etc/ssh/bc_krl", "etc/ssh/bc_principals/alice"} {
		if _, err := os.Lstat(filepath.Join(o.root, p)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
}
