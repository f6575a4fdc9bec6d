package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestAudit: named admin tokens act through the loopback listener, and
// bcgw audit lists a spec change and a revoke with the names of the
// tokens that made them; a removed token is refused from then on.
func TestAudit(t *testing.T) {
	l := newLab(t)
	gwDir := filepath.Join(l.root, "gw")
	g := l.startGateway(gwDir, "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
	admin := g.waitLog(t, "bcgw serving", time.Second)["admin_url"].(string)
	_, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	tokenFile := func(name string) string {
		var tok struct{ Name, Token string }
		if err := json.Unmarshal([]byte(l.bcgw(g, "admin-token", "create", name, "--json")), &tok); err != nil || tok.Name != name || len(tok.Token) < 32 {
			t.Fatalf("admin-token create %s: %+v %v", name, tok, err)
		}
		p := filepath.Join(l.root, name+".token")
		if err := os.WriteFile(p, []byte(tok.Token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	alice, bob := tokenFile("alice"), tokenFile("bob")
	as := func(tokFile string, args ...string) (int, string) {
		code, out, errOut := l.run("", nil, "bcgw", append(args, "--admin", admin, "--admin-token-file", tokFile)...)
		return code, out + errOut
	}
	if code, out := as(alice, "spec", "set", id, "--file", l.specFile("s.json", `{"telemetry":{}}`)); code != 0 {
		t.Fatalf("alice's spec set: exit %d %s", code, out)
	}
	if code, out := as(bob, "revoke", id); code != 0 {
		t.Fatalf("bob's revoke: exit %d %s", code, out)
	}
	if code, out := as(bob, "hold", "node_absent", "--alloc", "a", "--gpu", "0"); code == 0 {
		t.Fatalf("a hold on no node: exit 0 %s", out)
	}
	l.bcgw(g, "admin-token", "rm", "alice")
	if code, out := as(alice, "nodes"); code == 0 || !strings.Contains(out, "bearer token required") {
		t.Errorf("a removed token: exit %d %s", code, out)
	}
	if code, out := as(alice, "revoke", id); code == 0 {
		t.Errorf("a removed token revoked: %s", out)
	}

	var es []struct {
		Seq                          uint64
		Actor, Action, Target, Error string
		Status                       int
	}
	if err := json.Unmarshal([]byte(l.bcgw(g, "audit", "--json")), &es); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, e.Actor+" "+e.Action+" "+e.Target+" "+itoa(e.Status))
	}
	want := []string{
		"socket token.create",
		"socket admin-token.create alice 200",
		"socket admin-token.create bob 200",
		"alice spec.set " + id + " 200",
		"bob node.revoke " + id + " 200",
		"bob hold.add node_absent 404",
		"socket admin-token.rm alice 200",
	}
	if len(got) > 0 && strings.HasPrefix(got[0], "socket token.create jt") && strings.HasSuffix(got[0], " 200") {
		got[0] = "socket token.create"
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("bcgw audit --json:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	out := l.bcgw(g, "audit")
	for _, line := range []string{`(?m)^4 +\S+ +alice +spec\.set +` + id + ` +200 `, `(?m)^5 +\S+ +bob +node\.revoke +` + id + ` +200 `} {
		if !regexp.MustCompile(line).MatchString(out) {
			t.Errorf("bcgw audit lacks %q:\n%s", line, out)
		}
	}
	if !strings.Contains(g.stderr.String(), `"msg":"admin call","component":"bcgw","actor":"bob","action":"node.revoke","target":"`+id+`"`) {
		t.Errorf("the log lacks bob's revoke")
	}
	ls := l.bcgw(g, "admin-token", "ls")
	if !strings.Contains(ls, "default") || !strings.Contains(ls, "bob") || strings.Contains(ls, "alice") {
		t.Errorf("bcgw admin-token ls:\n%s", ls)
	}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
