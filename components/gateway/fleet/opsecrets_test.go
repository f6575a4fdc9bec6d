package fleet

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// FuzzCanonicalSecretName: whatever an operator types as a secret's
// name, an accepted one is telemetry-header/ and a header token, and its
// canonical form is accepted as itself; an error never panics.
func FuzzCanonicalSecretName(f *testing.F) {
	for _, s := range []string{"telemetry-header/authorization", "telemetry-header/X-API-Key", "telemetry-header/", "bmc-credentials",
		"telemetry-header/Content-Type", "telemetry-header/a b", "telemetry-header/\xff", "http-header/Authorization",
		"instance-user-data/alloc_a", "instance-user-data/../x", "instance-user-data/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c, err := CanonicalSecretName(name)
		if err != nil {
			return
		}
		if a, ok := strings.CutPrefix(c, SecretInstanceUserData); ok {
			if !allocationID(a) || c != name {
				t.Fatalf("%q accepted as %q", name, c)
			}
			return
		}
		h, ok := strings.CutPrefix(c, SecretTelemetryHeader)
		if !ok || h == "" || !headerToken(h) || !strings.EqualFold(c, name) {
			t.Fatalf("%q accepted as %q", name, c)
		}
		if again, err := CanonicalSecretName(c); err != nil || again != c {
			t.Fatalf("canonical %q is not itself: %q %v", c, again, err)
		}
	})
}

// TestSecretValues: a header value is one line of printable ASCII, 1 to
// 8192 bytes; the errors never hold it.
func TestSecretValues(t *testing.T) {
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{"Bearer abc.def", true},
		{strings.Repeat("a", maxSecretValue), true},
		{strings.Repeat("a", maxSecretValue+1), false},
		{"", false},
		{"Bearer s3cret\r\nX-Evil: 1", false},
		{"tab\there", false},
		{"caf\xc3\xa9", false},
	} {
		err := checkSecretValue([]byte(c.v))
		if (err == nil) != c.ok {
			t.Errorf("%q: %v", c.v, err)
		}
		if err != nil && len(c.v) > 3 && strings.Contains(err.Error(), c.v) {
			t.Errorf("the error holds the value: %v", err)
		}
	}
}

// TestUserDataValues: user data is 1 to 16 KiB of UTF-8 text, newlines
// included; the errors never hold it.
func TestUserDataValues(t *testing.T) {
	for _, c := range []struct {
		v  string
		ok bool
	}{
		{"#cloud-config\nruncmd:\n  - echo s3cret\n", true},
		{strings.Repeat("a", maxUserData), true},
		{strings.Repeat("a", maxUserData+1), false},
		{"", false},
		{"s3cret\xff\xfe", false},
	} {
		err := checkNamedValue(SecretInstanceUserData+"alloc_a", []byte(c.v))
		if (err == nil) != c.ok {
			t.Errorf("%q: %v", c.v, err)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("the error holds the value: %v", err)
		}
	}
	for name, ok := range map[string]bool{"instance-user-data/alloc_a": true, "instance-user-data/-a": false, "instance-user-data/a/b": false, "instance-user-data/" + strings.Repeat("a", 129): false} {
		if _, err := CanonicalSecretName(name); (err == nil) != ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestUserDataSecret: an instance's user data is answered only to a
// node agent asking with the workflow instances, for an allocation its
// desired spec's instances section gives user_data.
func TestUserDataSecret(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "bcgw.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Fleet{cfg: Config{DataDir: dir}, store: st, log: slog.New(slog.DiscardHandler)}
	for _, n := range []string{"node_a", "node_b"} {
		if err := st.PutNode(store.Node{ID: n, Role: "node", Site: "lab"}); err != nil {
			t.Fatal(err)
		}
	}
	spec := `{"instances":{"instances":[{"id":"vm-a","allocation":"alloc_a","user_data":true},{"id":"vm-b","allocation":"alloc_b"}]}}`
	if _, err := st.PutSpec("node_a", 0, []byte(spec), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"alloc_a", "alloc_b", "alloc_c"} {
		if _, err := s.SetSecret(SecretInstanceUserData+a, "", []byte("#cloud-config s3cret "+a)); err != nil {
			t.Fatal(err)
		}
	}
	node := &hub.Live{NodeID: "node_a", Role: "node"}
	for _, c := range []struct {
		name, alloc, workflow string
		live                  *hub.Live
		want                  string
	}{
		{"its allocation", "alloc_a", "instances", node, ""},
		{"an allocation without user_data", "alloc_b", "instances", node, "no instance of allocation alloc_b"},
		{"an allocation not in the spec", "alloc_c", "instances", node, "no instance of allocation alloc_c"},
		{"another workflow", "alloc_a", "telemetry", node, "workflow instances"},
		{"a site agent", "alloc_a", "instances", &hub.Live{NodeID: "node_a", Role: "site"}, "only a node agent"},
		{"another node", "alloc_a", "instances", &hub.Live{NodeID: "node_b", Role: "node"}, "no instance of allocation alloc_a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := s.userDataSecret(c.live, &bcdv1.SecretRequest{Name: SecretInstanceUserData + c.alloc, WorkflowId: c.workflow})
			if c.want == "" {
				if err != nil || string(v) != "#cloud-config s3cret alloc_a" {
					t.Fatalf("= %q, %v", v, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("= %q, %v; want a refusal containing %q", v, err, c.want)
			}
		})
	}
}
