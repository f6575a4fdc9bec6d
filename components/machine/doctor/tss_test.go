package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
)

func TestTSSCheck(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nbcd:x:990:990::/var/lib/bcd:/usr/sbin/nologin\ntssy:x:991:59::/:/bin/false\n"), 0o644)
	h := config.Helper{Socket: "/run/bcd-helper/helper.sock", User: "bcd"}
	for _, tc := range []struct {
		name, group, user string
		want              Status // "" = no check
	}{
		{"no tss group", "bcd:x:990:\n", "bcd", ""},
		{"outside it", "tss:x:59:someone\nbcd:x:990:\n", "bcd", ""},
		{"a member", "tss:x:59:someone,bcd\n", "bcd", Fail},
		{"by its primary group", "tss:x:59:\n", "tssy", Fail},
		{"unknown user", "tss:x:59:\n", "ghost", Warn},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := filepath.Join(t.TempDir(), "group")
			os.WriteFile(group, []byte(tc.group), 0o644)
			hh := h
			hh.User = tc.user
			cs := tssChecks(hh, passwd, group)
			if tc.want == "" {
				if len(cs) != 0 {
					t.Fatalf("a check where none belongs: %+v", cs[0].Run(context.Background()))
				}
				return
			}
			if len(cs) != 1 {
				t.Fatalf("%d checks", len(cs))
			}
			r := runOne(context.Background(), cs[0])[0]
			if r.Status != tc.want || r.Name != "tpm" {
				t.Fatalf("%+v", r)
			}
			if tc.want == Fail && !strings.Contains(r.Detail, "gpasswd -d "+tc.user+" tss") {
				t.Errorf("detail %q names no fix", r.Detail)
			}
		})
	}
	if cs := tssChecks(config.Helper{}, passwd, passwd); cs != nil {
		t.Error("a tpm check without [helper]")
	}
	if cs := tssChecks(h, passwd, filepath.Join(dir, "missing")); len(cs) != 1 || runOne(context.Background(), cs[0])[0].Status != Warn {
		t.Error("an unreadable group file is not a warning")
	}
}
