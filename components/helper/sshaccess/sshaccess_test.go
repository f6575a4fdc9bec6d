package sshaccess_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/sshaccess"
	"github.com/better-compute/bcd/components/helper/sshaccess/sshdtest"
)

const caLine = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP1UrUbkA/HMG5PYPTtjNljV18Cf8t9kA4v5lsmfZuu2 ca@bcgw"

func TestCheck(t *testing.T) {
	ok := sshaccess.Spec{UserCA: caLine, Principals: map[string][]string{"alice": {"node-1:alice"}},
		RevokedSerials: []uint64{3}, RevokedKeyIDs: []string{"bob-laptop"}}
	if err := ok.Check(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	bad := map[string]sshaccess.Spec{
		"newline in the CA":            {UserCA: caLine + "\nPermitRootLogin yes"},
		"CR in the CA":                 {UserCA: caLine + "\rx"},
		"keyword in the CA comment":    {UserCA: strings.Replace(caLine, "ca@bcgw", "AuthorizedKeysCommand", 1)},
		"not base64":                   {UserCA: "ssh-ed25519 !!!!"},
		"blob of another type":         {UserCA: "ssh-rsa " + strings.Fields(caLine)[1]},
		"unknown key type":             {UserCA: "ssh-dss " + strings.Fields(caLine)[1]},
		"principal with a newline":     {UserCA: caLine, Principals: map[string][]string{"alice": {"a\nMatch all"}}},
		"principal that is a keyword":  {UserCA: caLine, Principals: map[string][]string{"alice": {"Match"}}},
		"principal with options":       {UserCA: caLine, Principals: map[string][]string{"alice": {`command="sh" x`}}},
		"principal with a space":       {UserCA: caLine, Principals: map[string][]string{"alice": {"a b"}}},
		"account that is a keyword":    {UserCA: caLine, Principals: map[string][]string{"Include": {"x"}}},
		"account with a slash":         {UserCA: caLine, Principals: map[string][]string{"../etc": {"x"}}},
		"account without principals":   {UserCA: caLine, Principals: map[string][]string{"alice": {}}},
		"duplicate principal":          {UserCA: caLine, Principals: map[string][]string{"alice": {"p", "p"}}},
		"key id with a newline":        {UserCA: caLine, RevokedKeyIDs: []string{"x\nserial: 1"}},
		"serial 0":                     {UserCA: caLine, RevokedSerials: []uint64{0}},
		"principals without a CA":      {Principals: map[string][]string{"alice": {"p"}}},
		"principal starting with dash": {UserCA: caLine, Principals: map[string][]string{"alice": {"-oProxy"}}},
	}
	for name, s := range bad {
		t.Run(name, func(t *testing.T) {
			err := s.Check()
			if !errors.Is(err, sshaccess.ErrInvalid) {
				t.Fatalf("Check = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestDecodeIsStrict(t *testing.T) {
	for _, in := range []string{
		`{"user_ca":"` + caLine + `","User_CA":"x"}`,
		`{"USER_CA":"` + caLine + `"}`,
		`{"user_ca":"` + caLine + `","dropin":"PermitRootLogin yes"}`,
		`{"user_ca":"` + caLine + `"} {}`,
		`[]`,
	} {
		if _, err := sshaccess.Decode([]byte(in)); !errors.Is(err, sshaccess.ErrInvalid) {
			t.Errorf("Decode(%s) = %v, want ErrInvalid", in, err)
		}
	}
	s, err := sshaccess.Decode([]byte(`{"user_ca":"` + caLine + `","principals":{"alice":["p1"]}}`))
	if err != nil || s.Principals["alice"][0] != "p1" {
		t.Fatalf("Decode = %+v, %v", s, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"user_ca":"` + caLine + `","principals":{"alice":["node-1:alice"]},"revoked_serials":[2],"revoked_key_ids":["k"]}`))
	f.Add([]byte(`{"user_ca":"ssh-ed25519 AAAA\nMatch all"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := sshaccess.Decode(data)
		if err != nil {
			return
		}
		// Whatever checks renders with no line sshd would read beyond the
		// one key (the CA) or one principal per line.
		if s.UserCA != "" {
			ca, err := sshaccess.RenderCA(s.UserCA)
			if err != nil || bytes.Count(ca, []byte("\n")) != 1 || len(strings.Fields(string(ca))) != 2 {
				t.Fatalf("CA %q rendered %q, %v", s.UserCA, ca, err)
			}
		}
		for a, ps := range s.Principals {
			out := sshaccess.RenderPrincipals(ps)
			if bytes.Count(out, []byte("\n")) != len(ps) || bytes.ContainsAny(out, " \t\"\r") {
				t.Fatalf("principals of %s rendered %q", a, out)
			}
		}
	})
}

// fakeHost keeps files under a temporary root and counts what it runs.
func fakeHost(t *testing.T, uids map[string]int) (*sshaccess.Host, *int) {
	root := t.TempDir()
	reloads := 0
	h := &sshaccess.Host{Root: root, Files: sshaccess.DirFiles{Root: root},
		Account: func(n string) (int, error) {
			if uid, ok := uids[n]; ok {
				return uid, nil
			}
			return 0, fmt.Errorf("unknown user %s", n)
		},
		KeyGen: func(ctx context.Context, args ...string) ([]byte, error) {
			return sshaccess.Run(ctx, "ssh-keygen", args...)
		},
		SSHDTest: func(context.Context) error { return nil },
		Reload:   func(context.Context) error { reloads++; return nil },
		TempDir:  t.TempDir()}
	return h, &reloads
}

func TestRootAndSystemAccountsRefused(t *testing.T) {
	testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	h, reloads := fakeHost(t, map[string]int{"root": 0, "daemon": 1, "nobody": 65534, "alice": 1000})
	for _, acct := range []string{"root", "daemon", "nobody", "mallory"} {
		s := sshaccess.Spec{UserCA: caLine, Principals: map[string][]string{acct: {"p"}, "alice": {"a"}}}
		_, err := sshaccess.Apply(context.Background(), h, s)
		if !errors.Is(err, sshaccess.ErrAccount) {
			t.Fatalf("principals for %s: %v, want ErrAccount", acct, err)
		}
		if ents, _ := os.ReadDir(filepath.Join(h.Root, "etc")); len(ents) != 0 || *reloads != 0 {
			t.Fatalf("principals for %s: files written (%v) or sshd reloaded (%d)", acct, ents, *reloads)
		}
	}
	// Root's own configuration lets root in.
	h.AllowSystem = []string{"root"}
	s := sshaccess.Spec{UserCA: caLine, Principals: map[string][]string{"root": {"p"}}}
	if _, err := sshaccess.Apply(context.Background(), h, s); err != nil {
		t.Fatalf("root allowed by root's configuration: %v", err)
	}
}

func TestApplyWritesRemovesAndReloadsOnlyOnDropinChange(t *testing.T) {
	testenv.NeedTool(t, "ssh-keygen", "openssh-client")
	ctx := context.Background()
	h, reloads := fakeHost(t, map[string]int{"alice": 1000, "bob": 1001})
	s := sshaccess.Spec{UserCA: caLine, Principals: map[string][]string{"alice": {"n1:alice"}, "bob": {"n1:bob"}}}
	res, err := sshaccess.Apply(ctx, h, s)
	if err != nil || !res.Reloaded || *reloads != 1 {
		t.Fatalf("first apply: %+v, %v, reloads %d", res, err, *reloads)
	}
	dropin, _ := os.ReadFile(filepath.Join(h.Root, "etc/ssh/sshd_config.d/10-better-compute.conf"))
	for _, want := range []string{"TrustedUserCAKeys " + h.Root + "/etc/ssh/bc_ca.pub", "RevokedKeys " + h.Root + "/etc/ssh/bc_krl",
		"AuthorizedPrincipalsFile " + h.Root + "/etc/ssh/bc_principals/%u"} {
		if !strings.Contains(string(dropin), want+"\n") {
			t.Fatalf("drop-in lacks %q:\n%s", want, dropin)
		}
	}
	ca, _ := os.ReadFile(filepath.Join(h.Root, "etc/ssh/bc_ca.pub"))
	if string(ca) != strings.TrimSuffix(caLine, " ca@bcgw")+"\n" {
		t.Fatalf("CA file %q", ca)
	}
	if plan, err := sshaccess.Plan(ctx, h, s); err != nil || len(plan) != 0 {
		t.Fatalf("plan after apply: %v, %v", plan, err)
	}
	// Revoking and dropping bob rewrites files but not the drop-in.
	s2 := sshaccess.Spec{UserCA: caLine, Principals: map[string][]string{"alice": {"n1:alice"}}, RevokedSerials: []uint64{7}}
	if plan, _ := sshaccess.Plan(ctx, h, s2); len(plan) != 2 {
		t.Fatalf("plan for a revocation and a removed account: %v", plan)
	}
	res, err = sshaccess.Apply(ctx, h, s2)
	if err != nil || res.Reloaded || *reloads != 1 || len(res.Changed) != 2 {
		t.Fatalf("second apply: %+v, %v, reloads %d", res, err, *reloads)
	}
	if _, err := os.Stat(filepath.Join(h.Root, "etc/ssh/bc_principals/bob")); !os.IsNotExist(err) {
		t.Fatalf("bob's principals file: %v", err)
	}
	// Applying the same again changes nothing (the KRL's timestamp aside).
	if res, err = sshaccess.Apply(ctx, h, s2); err != nil || len(res.Changed) != 0 {
		t.Fatalf("third apply: %+v, %v", res, err)
	}
	// An empty section removes everything and reloads.
	if res, err = sshaccess.Apply(ctx, h, sshaccess.Spec{}); err != nil || !res.Reloaded || *reloads != 2 {
		t.Fatalf("empty apply: %+v, %v", res, err)
	}
	for _, k := range []string{"ssh-dropin", "ssh-ca", "ssh-krl"} {
		tg, _ := filetable.Resolve(k, "")
		if _, err := os.Stat(filepath.Join(h.Root, tg.Path())); !os.IsNotExist(err) {
			t.Fatalf("%s left: %v", k, err)
		}
	}
}

// TestRealSSHD applies sections to Debian's sshd on a loopback port and
// logs in with certificates: accepted, revoked, unknown principal, expired;
// then sshd -t rejecting a change puts the previous files back.
func TestRealSSHD(t *testing.T) {
	testenv.NeedRoot(t, "sshd runs as root and a test account is created")
	testenv.NeedTool(t, "sshd", "openssh-server")
	testenv.NeedTool(t, "ssh", "openssh-client")
	ctx := context.Background()
	root := sshdtest.Root(t)
	port := sshdtest.FreePort(t)
	sshdtest.Config(t, root, port)
	acct := sshdtest.Account(t)
	keys := t.TempDir()
	caKey := sshdtest.UserKey(t, keys, "ca")
	caPub, _ := os.ReadFile(caKey + ".pub")
	userKey := sshdtest.UserKey(t, keys, "user")
	sign := func(name, principal, serial, validity string) string {
		t.Helper()
		pub := filepath.Join(keys, name+".pub")
		b, _ := os.ReadFile(userKey + ".pub")
		os.WriteFile(pub, b, 0o600)
		if out, err := exec.Command("ssh-keygen", "-q", "-s", caKey, "-I", name, "-n", principal, "-z", serial, "-V", validity, pub).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen -s: %v: %s", err, out)
		}
		return filepath.Join(keys, name+"-cert.pub")
	}
	principal := "node-1:" + acct
	good := sign("good", principal, "1", "-5m:+10m")
	revoked := sign("revoked", principal, "2", "-5m:+10m")
	other := sign("other", "node-2:"+acct, "3", "-5m:+10m")
	expired := sign("expired", principal, "4", "20200101:20200102")

	h := sshaccess.SystemHost(root, sshaccess.DirFiles{Root: root}, nil)
	h.TempDir = t.TempDir()
	s := sshaccess.Spec{UserCA: strings.TrimSpace(string(caPub)), Principals: map[string][]string{acct: {principal}},
		RevokedSerials: []uint64{2}}
	sshdtest.Start(t, root, port)
	res, err := sshaccess.Apply(ctx, h, s)
	if err != nil || !res.Reloaded {
		t.Fatalf("apply: %+v, %v", res, err)
	}
	login := func(cert string) error {
		args := sshdtest.SSHArgs(userKey, cert, "-p", fmt.Sprint(port), acct+"@127.0.0.1", "id -un")
		out, err := exec.Command("ssh", args...).CombinedOutput()
		if err == nil && strings.TrimSpace(string(out)) != acct {
			return fmt.Errorf("logged in as %q", out)
		}
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	// sshd reloads on SIGHUP by re-executing; wait for it to listen again.
	waitLogin(t, func() error { return login(good) })
	for name, cert := range map[string]string{"revoked": revoked, "unknown principal": other, "expired": expired} {
		if err := login(cert); err == nil {
			t.Errorf("%s certificate logged in", name)
		}
	}

	// sshd -t rejecting the result puts every file back.
	before := snapshot(t, root)
	cfg := sshaccess.SSHDConfig(root)
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, append(b, []byte("NoSuchKeyword yes\n")...), 0o644)
	s2 := sshaccess.Spec{UserCA: s.UserCA, Principals: map[string][]string{acct: {"other"}}, RevokedSerials: []uint64{2, 9}}
	if _, err := sshaccess.Apply(ctx, h, s2); !errors.Is(err, sshaccess.ErrRejected) {
		t.Fatalf("apply with sshd -t failing: %v, want ErrRejected", err)
	}
	if after := snapshot(t, root); after != before {
		t.Fatalf("files not put back:\nbefore %s\nafter  %s", before, after)
	}
	os.WriteFile(cfg, b, 0o644)
	if err := login(good); err != nil {
		t.Fatalf("login after the rejected change: %v", err)
	}
}

func waitLogin(t *testing.T, f func() error) {
	t.Helper()
	var err error
	for range 50 {
		if err = f(); err == nil {
			return
		}
		sleep()
	}
	t.Fatalf("login with a good certificate: %v", err)
}

// snapshot is every ssh-* file under root with its content.
func snapshot(t *testing.T, root string) string {
	var b strings.Builder
	filepath.Walk(filepath.Join(root, "etc/ssh"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && (strings.Contains(p, "bc_") || strings.Contains(p, "better-compute")) {
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, "%s=%x;", p, data)
		}
		return nil
	})
	return b.String()
}
