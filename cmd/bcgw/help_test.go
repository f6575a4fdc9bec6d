package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryCommandAnswersHelp: every bcgw command and group answers -h
// with exit 0 and, on stdout, one usage style, "usage: bcgw CMD ..."
// naming its positionals; every verb of a group the same. A command
// added to the table in main.go must be added here.
func TestEveryCommandAnswersHelp(t *testing.T) {
	want := map[string]string{
		"serve": "usage: bcgw serve [flags]", "token": "usage: bcgw token create ", "node": "usage: bcgw node rm NODE",
		"nodes": "usage: bcgw nodes [flags]", "admin-token": "usage: bcgw admin-token create NAME", "audit": "usage: bcgw audit [flags]", "backup": "usage: bcgw backup [flags]", "serving-cert": "usage: bcgw serving-cert renew",
		"page": "usage: bcgw page [flags]", "health": "usage: bcgw health [flags]", "tpm": "usage: bcgw tpm enroll ",
		"run": "usage: bcgw run NODE KIND ", "sign": "usage: bcgw sign [flags]", "trust": "usage: bcgw trust show ",
		"batch": "usage: bcgw batch create ", "revoke": "usage: bcgw revoke NODE", "cancel": "usage: bcgw cancel COMMAND",
		"discovered": "usage: bcgw discovered SITE", "status": "usage: bcgw status NODE", "spec": "usage: bcgw spec set NODE ",
		"instance": "usage: bcgw instance add NODE ", "instances": "usage: bcgw instances NODE", "snapshot": "usage: bcgw snapshot NODE INSTANCE", "hold": "usage: bcgw hold NODE ",
		"ssh-ca": "usage: bcgw ssh-ca [NODE ...]", "ssh-sign": "usage: bcgw ssh-sign ", "tunnel": "usage: bcgw tunnel NODE ",
		"console": "usage: bcgw console NODE ", "release": "usage: bcgw release NODE ", "upgrade": "usage: bcgw upgrade NODE|--all ",
		"events": "usage: bcgw events NODE ", "cache-images": "usage: bcgw cache-images SITE ", "bmc-credentials": "usage: bcgw bmc-credentials [flags]",
		"secret": "usage: bcgw secret set NAME ", "kek": "usage: bcgw kek generate ", "well-known": "usage: bcgw well-known [flags]",
	}
	verbs := [][]string{
		{"token", "create"}, {"token", "ls"}, {"token", "rm"}, {"node", "rm"}, {"admin-token", "create"}, {"admin-token", "ls"},
		{"admin-token", "rm"}, {"trust", "show"}, {"trust", "add-root"}, {"trust", "remove-root"}, {"trust", "rotate-key"},
		{"spec", "set"}, {"spec", "get"}, {"spec", "patch"}, {"spec", "prepare"}, {"spec", "submit"}, {"batch", "create"},
		{"batch", "approve"}, {"batch", "submit"}, {"kek", "generate"}, {"kek", "fingerprint"}, {"kek", "rotate"}, {"tpm", "enroll"},
		{"serving-cert", "renew"}, {"secret", "set"}, {"secret", "delete"}, {"secret", "list"}, {"release", "publish"}, {"release", "list"},
	}
	seen := map[string]bool{}
	for _, c := range program().Commands {
		seen[c.Name] = true
		if _, ok := want[c.Name]; !ok {
			t.Errorf("bcgw %s is not in this table", c.Name)
		}
	}
	for name, prefix := range want {
		if !seen[name] {
			t.Errorf("the table names bcgw %s, which is no command", name)
			continue
		}
		for _, h := range []string{"-h", "--help"} {
			code, out, errOut := runCLI(t, context.Background(), "", name, h)
			if code != 0 || !strings.HasPrefix(out, prefix) {
				t.Errorf("bcgw %s %s: exit %d, stdout %q, stderr %q; want exit 0 and %q", name, h, code, firstLine(out), firstLine(errOut), prefix)
			}
		}
	}
	for _, v := range verbs {
		code, out, errOut := runCLI(t, context.Background(), "", v[0], v[1], "-h")
		if code != 0 || !strings.HasPrefix(out, "usage: bcgw "+v[0]+" ") || !strings.Contains(firstLine(out), v[0]+" "+v[1]) {
			t.Errorf("bcgw %s %s -h: exit %d, stdout %q, stderr %q", v[0], v[1], code, firstLine(out), firstLine(errOut))
		}
	}
}

// TestStateHasJSON: every command that prints state in words takes
// --json (those that print JSON always, such as run, cancel, sign, the
// batch verbs and well-known, need none).
func TestStateHasJSON(t *testing.T) {
	for _, c := range [][]string{
		{"nodes"}, {"status"}, {"events"}, {"health"}, {"audit"}, {"page"}, {"backup"}, {"discovered"}, {"instances"},
		{"revoke"}, {"hold"}, {"release"}, {"cache-images"}, {"ssh-ca"}, {"token", "create"}, {"token", "ls"}, {"token", "rm"},
		{"node", "rm"}, {"admin-token", "create"}, {"admin-token", "ls"}, {"admin-token", "rm"}, {"trust", "show"},
		{"trust", "add-root"}, {"trust", "remove-root"}, {"trust", "rotate-key"}, {"spec", "set"}, {"spec", "patch"},
		{"spec", "submit"}, {"kek", "fingerprint"}, {"kek", "rotate"}, {"secret", "list"}, {"release", "list"}, {"tpm", "enroll"},
		{"serving-cert", "renew"},
	} {
		_, out, _ := runCLI(t, context.Background(), "", append(c, "-h")...)
		if !strings.Contains(out, "-json") {
			t.Errorf("bcgw %s takes no --json", strings.Join(c, " "))
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// TestServeChecksFlagsFirst: bcgw serve refuses a bad flag with exit 2
// before it makes anything: no data directory, key or socket is left.
func TestServeChecksFlagsFirst(t *testing.T) {
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--listen", "nonsense"}, "--listen"},
		{[]string{"--listen", "127.0.0.1:99999"}, "0 to 65535"},
		{[]string{"--admin-listen", "0.0.0.0:9000"}, "loopback"},
		{[]string{"--admin-listen", "localhost"}, "--admin-listen"},
		{[]string{"--url", "http://gw.lab:8443"}, "https URL"},
		{[]string{"--server-name", ""}, "--server-name"},
		{[]string{"--max-sessions", "-5"}, "--max-sessions"},
		{[]string{"--join-rate", "-7"}, "--join-rate"},
		{[]string{"--cert-validity", "-1s"}, "--cert-validity"},
		{[]string{"--heartbeat", "0s"}, "--heartbeat"},
		{[]string{"--lease-ttl", "0s"}, "--lease-ttl"},
		{[]string{"--pushback", "-1s"}, "--pushback"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		code, _, errOut := runCLI(t, context.Background(), "", append([]string{"serve", "--data-dir", dir}, c.flags...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("serve %v: exit %d, %q; want 2 naming %s", c.flags, code, errOut, c.want)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("serve %v left %s: %v", c.flags, dir, err)
		}
	}
}
