package gateway_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store/pgstore"
	"github.com/better-compute/bcd/components/gateway/store/pgtest"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// TestTelemetryHeaderSecrets: an operator sets telemetry-header/<Name>
// for the fleet and for one node; a node whose telemetry section names
// the header gets the node's value, else the fleet's, only sealed to its
// request's reply key. A header its spec does not name, another
// workflow, a name bcgw does not know and a value that is no header value
// are refused with errors that hold no value. The store holds the values
// only sealed (the bbolt file, or every meta value in PostgreSQL), and no
// log line, list or frame in clear holds one.
func TestTelemetryHeaderSecrets(t *testing.T) {
	for _, backend := range []string{"bbolt", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			var (
				cfg    gateway.Config
				dbURL  string
				stored func() []byte
			)
			if backend == "postgres" {
				dbURL = pgtest.Database(t)
				cfg.Database = dbURL
				cfg.KEKFile, _ = writeKEK(t)
			}
			g := startGateway(t, cfg)
			stored = func() []byte {
				if dbURL == "" {
					b, err := os.ReadFile(filepath.Join(g.dir, "bcgw.db"))
					if err != nil {
						t.Fatal(err)
					}
					return b
				}
				pg, err := pgstore.Open(context.Background(), dbURL)
				if err != nil {
					t.Fatal(err)
				}
				defer pg.Close()
				m, err := pg.MetaPrefix("")
				if err != nil {
					t.Fatal(err)
				}
				var all []byte
				for k, v := range m {
					all = append(append(append(all, k...), 0), v...)
				}
				return all
			}
			testHeaderSecrets(t, g, stored, backend == "bbolt")
		})
	}
}

func testHeaderSecrets(t *testing.T, g *gw, stored func() []byte, bbolt bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ac := adminapi.NewClient(g.dir, "", "")
	a := g.join(t)
	other := g.join(t)
	const (
		fleetValue = "Bearer fleet-s3cret-VALUE-1"
		nodeValue  = "Bearer node-s3cret-VALUE-2"
		otherValue = "other-s3cret-VALUE-3"
	)
	values := []string{fleetValue, nodeValue, otherValue}
	if _, err := ac.SetSpec(ctx, a.NodeID, []byte(`{"telemetry":{"endpoint":"https://127.0.0.1:4318","headers":["authorization"]}}`)); err != nil {
		t.Fatal(err)
	}
	st := g.agentSession(t, ctx, a, &bcdv1.Hello{})
	var frames [][]byte
	n := 0
	ask := func(name, workflow string) (string, error) {
		t.Helper()
		n++
		req := &bcdv1.SecretRequest{RequestId: "tel-" + string(rune('a'+n)), Name: name, WorkflowId: workflow}
		o, err := seal.NewRequest(a.Key, a.NodeID, req, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sendFrame(t, st, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_SecretRequest{SecretRequest: req}})
		for {
			f := recv(t, st)
			b, _ := proto.Marshal(f)
			frames = append(frames, b)
			ans := f.GetSecretAnswer()
			if ans.GetRequestId() != req.RequestId {
				continue
			}
			if ans.GetError() != "" {
				if ans.GetSealed() != "" || len(ans.GetValue()) != 0 {
					t.Fatalf("a refusal carries a value: %+v", ans)
				}
				return "", errString(ans.GetError())
			}
			v, err := o.Open(ans, time.Now())
			if err != nil {
				t.Fatalf("opening the answer: %v", err)
			}
			return string(v), nil
		}
	}

	// Nothing set yet: the section would stay RETRYING, and says why.
	if _, err := ask("telemetry-header/Authorization", "telemetry"); err == nil || !strings.Contains(err.Error(), "bcgw secret set telemetry-header/Authorization") {
		t.Fatalf("before any secret is set: %v", err)
	}
	name, err := ac.SetSecret(ctx, "telemetry-header/authorization", "", []byte(fleetValue))
	if err != nil || name != "telemetry-header/Authorization" {
		t.Fatalf("set the fleet's value: %q %v", name, err)
	}
	if v, err := ask("telemetry-header/Authorization", "telemetry"); err != nil || v != fleetValue {
		t.Fatalf("the fleet's value: %v", err)
	}
	if _, err := ac.SetSecret(ctx, "telemetry-header/Authorization", a.NodeID, []byte(nodeValue)); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.SetSecret(ctx, "telemetry-header/X-Other", "", []byte(otherValue)); err != nil {
		t.Fatal(err)
	}
	if v, err := ask("telemetry-header/Authorization", "telemetry"); err != nil || v != nodeValue {
		t.Fatalf("the node's own value comes first: %v", err)
	}

	// Refusals.
	for _, c := range []struct{ name, workflow, want string }{
		{"telemetry-header/X-Other", "telemetry", "names no header X-Other"},
		{"telemetry-header/Authorization", "cmd-1", "workflow telemetry"},
		{"telemetry-header/authorization", "telemetry", "no secret"}, // not canonical: the agent asks canonical
		{"telemetry-header/", "telemetry", "no secret"},
	} {
		if _, err := ask(c.name, c.workflow); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ask %s (workflow %s): %v, want %q", c.name, c.workflow, err, c.want)
		}
	}
	for _, c := range []struct{ name, node, value, want string }{
		{"bmc-credentials", "", "x", "no settable secret"},
		{"http-header/Authorization", "", "x", "no settable secret"},
		{"telemetry-header/Content-Type", "", "x", "the exporter's own"},
		{"telemetry-header/Bad Name", "", "x", "not an HTTP header name"},
		{"telemetry-header/Authorization", "", "Bearer new\nline-s3cret", "not printable ASCII"},
		{"telemetry-header/Authorization", "", "", "1 to 8192"},
		{"telemetry-header/Authorization", "node_nope", "x", "not found"},
	} {
		_, err := ac.SetSecret(ctx, c.name, c.node, []byte(c.value))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("set %s: %v, want %q", c.name, err, c.want)
		} else if c.value != "" && c.value != "x" && strings.Contains(err.Error(), c.value) {
			t.Errorf("the error holds the value: %v", err)
		}
	}

	// The other node's spec has no telemetry section: it gets nothing.
	ost := g.agentSession(t, ctx, other, &bcdv1.Hello{})
	oreq := &bcdv1.SecretRequest{RequestId: "other-1", Name: "telemetry-header/Authorization", WorkflowId: "telemetry"}
	if _, err := seal.NewRequest(other.Key, other.NodeID, oreq, time.Now()); err != nil {
		t.Fatal(err)
	}
	sendFrame(t, ost, &bcdv1.AgentFrame{Frame: &bcdv1.AgentFrame_SecretRequest{SecretRequest: oreq}})
	for {
		f := recv(t, ost)
		if ans := f.GetSecretAnswer(); ans != nil {
			if ans.GetError() == "" || !strings.Contains(ans.GetError(), "no telemetry section") {
				t.Fatalf("a node without the section: %+v", ans)
			}
			break
		}
	}

	list, err := ac.Secrets(ctx)
	if err != nil || len(list) != 3 || list[0].Name != "telemetry-header/Authorization" || list[0].Node != "" || list[1].Node != a.NodeID || list[2].Name != "telemetry-header/X-Other" {
		t.Fatalf("list: %+v %v", list, err)
	}
	// Deleting the node's value falls back to the fleet's.
	if _, err := ac.DeleteSecret(ctx, "telemetry-header/Authorization", a.NodeID); err != nil {
		t.Fatal(err)
	}
	if v, err := ask("telemetry-header/Authorization", "telemetry"); err != nil || v != fleetValue {
		t.Fatalf("after deleting the node's value: %v", err)
	}
	if _, err := ac.DeleteSecret(ctx, "telemetry-header/Authorization", a.NodeID); err == nil || !strings.Contains(err.Error(), "no secret") {
		t.Errorf("deleting it twice: %v", err)
	}

	// A removed node's own secrets go with it; the fleet's stay.
	if _, err := ac.SetSecret(ctx, "telemetry-header/Authorization", other.NodeID, []byte(nodeValue)); err != nil {
		t.Fatal(err)
	}
	if err := ac.RemoveNode(ctx, other.NodeID); err != nil {
		t.Fatal(err)
	}
	if list, err := ac.Secrets(ctx); err != nil || len(list) != 2 || list[0].Node != "" || list[1].Node != "" {
		t.Errorf("after removing node %s: %+v %v", other.NodeID, list, err)
	}

	raw := stored()
	for _, v := range values {
		if bytes.Contains(raw, []byte(v)) {
			t.Errorf("the store holds %q in clear", v)
		}
		if strings.Contains(g.logs.String(), v) {
			t.Errorf("the gateway's log holds %q", v)
		}
		for _, f := range frames {
			if bytes.Contains(f, []byte(v)) {
				t.Errorf("a frame bcgw sent holds %q in clear", v)
			}
		}
	}
	fi, err := os.Stat(filepath.Join(g.dir, "secrets.kek"))
	switch {
	case bbolt && (err != nil || fi.Mode().Perm() != 0o600):
		t.Errorf("the bbolt gateway's secrets key: %v %v", fi, err)
	case !bbolt && err == nil:
		t.Errorf("a gateway on a database made secrets.kek: it seals under the fleet's key-encryption key")
	}
}

type errString string

func (e errString) Error() string { return string(e) }
