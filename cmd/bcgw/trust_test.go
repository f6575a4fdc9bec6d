package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/pki"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// keyFiles writes a new P-256 key as KEY.pem (0600) and its public key
// as PUB.pem, and returns both paths and the key's PEM.
func keyFiles(t *testing.T) (keyPath, pubPath string, keyPEM []byte, spki []byte) {
	t.Helper()
	k, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = pki.MarshalPrivateKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	spki, _ = x509.MarshalPKIXPublicKey(k.Public())
	dir := t.TempDir()
	keyPath, pubPath = filepath.Join(dir, "KEY.pem"), filepath.Join(dir, "PUB.pem")
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki}), 0o644); err != nil {
		t.Fatal(err)
	}
	return keyPath, pubPath, keyPEM, spki
}

// noKeyIn fails when out shows any part of the private key.
func noKeyIn(t *testing.T, what, out string, keyPEM []byte) {
	t.Helper()
	blk, _ := pem.Decode(keyPEM)
	if strings.Contains(out, "BEGIN PRIVATE KEY") || strings.Contains(out, base64.StdEncoding.EncodeToString(blk.Bytes)[40:80]) ||
		strings.Contains(out, string(keyPEM[40:80])) {
		t.Errorf("%s shows the private key:\n%s", what, out)
	}
}

func TestTrustCommands(t *testing.T) {
	_, dir := startServer(t)
	ctx := context.Background()
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, "", append(args, "--data-dir", dir)...)
	}
	code, out, errOut := run("trust", "show")
	if code != 0 || !strings.Contains(out, "version  1") || !strings.Contains(out, "(a root)") || !strings.Contains(out, "(bcgw's own key)") {
		t.Fatalf("trust show: exit %d\n%s%s", code, out, errOut)
	}
	_, pub, _, spki := keyFiles(t)
	if code, out, errOut := run("trust", "add-root", "--key", pub); code != 0 || out != "2\n" {
		t.Fatalf("add-root: exit %d %q %q", code, out, errOut)
	}
	if code, out, errOut := run("trust", "add-root", "--key", pub); code != 0 || out != "2\n" || !strings.Contains(errOut, "unchanged") {
		t.Fatalf("add-root again: exit %d %q %q", code, out, errOut)
	}
	code, out, _ = run("trust", "show", "--json")
	var v adminapi.TrustView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Version != 2 || len(v.Roots) != 2 || !v.OwnKeyIsRoot {
		t.Fatalf("trust show --json: exit %d %s", code, out)
	}
	if p, _ := pki.Pin(mustParse(t, spki)); v.Roots[1].Pin != p || v.Roots[1].Own {
		t.Errorf("second root %+v, want %s", v.Roots[1], p)
	}
	if code, out, errOut := run("trust", "remove-root", "--key", pub, "--json"); code != 0 || !strings.Contains(out, `"version": 3`) {
		t.Fatalf("remove-root: exit %d %q %q", code, out, errOut)
	}
	// Refusals: not P-256, a private key, no --key, unknown verb.
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(p384.Public())
	p384File := filepath.Join(t.TempDir(), "p384.pem")
	_ = os.WriteFile(p384File, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600)
	keyPath, _, keyPEM, _ := keyFiles(t)
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"trust", "add-root", "--key", p384File}, cli.ExitFailure, "P-256"},
		{[]string{"trust", "add-root", "--key", keyPath}, cli.ExitFailure, `want "PUBLIC KEY"`},
		{[]string{"trust", "remove-root", "--key", pub}, cli.ExitFailure, "not a command-signing root"},
		{[]string{"trust", "add-root"}, cli.ExitUsage, "--key is required"},
		{[]string{"trust", "frob"}, cli.ExitUsage, "usage: bcgw trust show"},
	} {
		code, out, errOut := run(tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want %d and %q", tt.args, code, errOut, tt.code, tt.want)
		}
		noKeyIn(t, strings.Join(tt.args, " "), out+errOut, keyPEM)
	}
	if v, _ := adminapi.NewClient(dir, "", "").Trust(ctx); v.Version != 3 {
		t.Errorf("version %d after refusals, want 3", v.Version)
	}
}

func mustParse(t *testing.T, der []byte) any {
	t.Helper()
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The external-signing round trip through the CLI: run --prepare, sign
// (no data directory), run --submit; spec prepare, sign, spec submit;
// bcgw sign never shows the key.
func TestExternalSigning(t *testing.T) {
	s, dir := startServer(t)
	ctx := context.Background()
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runCLI(t, ctx, stdin, append(args, "--data-dir", dir)...)
	}
	keyPath, pub, keyPEM, _ := keyFiles(t)
	if code, _, errOut := run("", "trust", "add-root", "--key", pub); code != 0 {
		t.Fatalf("add-root: %s", errOut)
	}
	work := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	code, prepared, errOut := run("", "run", "node_a", "agent.ping", "--body", `{"msg": "<a&b>"}`, "--deadline", "1h", "--prepare")
	if code != 0 {
		t.Fatalf("run --prepare: exit %d %s", code, errOut)
	}
	var pc adminapi.PreparedCommand
	if json.Unmarshal([]byte(prepared), &pc) != nil || pc.NodeID != "node_a" || pc.Kind != "agent.ping" || len(pc.Signature) != 0 {
		t.Fatalf("prepared command %s", prepared)
	}
	if _, err := s.Store().Command(pc.ID); err == nil {
		t.Error("--prepare stored the command")
	}
	// bcgw sign runs without a gateway: no --data-dir at all.
	code, signed, errOut := runCLI(t, ctx, "", "sign", "--key", keyPath, "--in", file("cmd.json", prepared))
	if code != 0 || !strings.Contains(errOut, "signed command "+pc.ID) {
		t.Fatalf("sign: exit %d %q", code, errOut)
	}
	noKeyIn(t, "bcgw sign", signed+errOut, keyPEM)
	// From stdin as well.
	if code, out, errOut := runCLI(t, ctx, prepared, "sign", "--key", keyPath); code != 0 || !strings.Contains(out, `"signature"`) {
		t.Fatalf("sign from stdin: exit %d %q", code, errOut)
	}
	code, out, errOut := run("", "run", "--submit", file("signed.json", signed))
	var view adminapi.CommandView
	if code != 0 || json.Unmarshal([]byte(out), &view) != nil || view.ID != pc.ID || !view.Signed || errOut != "" {
		t.Fatalf("run --submit: exit %d %q %q", code, out, errOut)
	}
	c, err := s.Store().Command(pc.ID)
	if err != nil || string(c.Body) != `{"msg":"<a&b>"}` {
		t.Fatalf("stored %+v %v", c, err)
	}
	roots := rootsOf(t, s)
	if err := roots.VerifyCommand(&bcdv1.Command{Id: c.ID, NodeId: c.NodeID, Kind: c.Kind, Body: c.Body, DeadlineUnixMs: c.DeadlineMS,
		Lane: c.Lane, WorkflowId: c.WorkflowID, Signature: c.Signature}); err != nil {
		t.Errorf("the submitted command does not verify: %v", err)
	}
	// An unsigned prepared command is sent unsigned, with a warning.
	_, prepared2, _ := run("", "run", "node_a", "agent.ping", "--prepare")
	code, out, errOut = run("", "run", "--submit", file("unsigned.json", prepared2))
	view = adminapi.CommandView{}
	if code != 0 || !strings.Contains(errOut, "UNSIGNED") || json.Unmarshal([]byte(out), &view) != nil || view.Signed {
		t.Fatalf("unsigned submit: exit %d %q %q", code, out, errOut)
	}
	// Malformed files are refused before any call.
	var m map[string]any
	_ = json.Unmarshal([]byte(prepared2), &m)
	m["deadline_unix_ms"] = "soon"
	bad, _ := json.Marshal(m)
	for name, content := range map[string]string{"a malformed command": string(bad), "not JSON": "{", "a spec": `{"node":"node_a","generation":1,"patch":false,"base_generation":0,"spec":{}}`} {
		if code, _, errOut := run("", "run", "--submit", file("bad.json", content)); code != cli.ExitFailure {
			t.Errorf("%s submitted: exit %d %q", name, code, errOut)
		}
	}
	for _, args := range [][]string{{"run", "--submit", "f", "node_a", "k"}, {"run", "node_a", "k", "--prepare", "--wait"}, {"run", "node_a"}} {
		if code, _, errOut := run("", args...); code != cli.ExitUsage {
			t.Errorf("%v: exit %d %q, want usage", args, code, errOut)
		}
	}

	// Specs.
	code, preparedSpec, errOut := run(`{"host": {"hostname": "h<1>"}}`, "spec", "prepare", "node_a", "--file", "-")
	if code != 0 {
		t.Fatalf("spec prepare: exit %d %s", code, errOut)
	}
	var ps adminapi.PreparedSpec
	if json.Unmarshal([]byte(preparedSpec), &ps) != nil || ps.Node != "node_a" || ps.Generation != 1 || ps.Patch {
		t.Fatalf("prepared spec %s", preparedSpec)
	}
	code, signedSpec, errOut := runCLI(t, ctx, "", "sign", "--key", keyPath, "--in", file("spec.json", preparedSpec))
	if code != 0 || !strings.Contains(errOut, "signed spec generation 1 of node_a") {
		t.Fatalf("sign spec: exit %d %q", code, errOut)
	}
	noKeyIn(t, "bcgw sign (spec)", signedSpec+errOut, keyPEM)
	if code, out, errOut := run("", "spec", "submit", file("spec-signed.json", signedSpec)); code != 0 || out != "1\n" || errOut != "" {
		t.Fatalf("spec submit: exit %d %q %q", code, out, errOut)
	}
	// A patch prepared, then the generation moves: refused.
	_, preparedPatch, _ := run(`{"daemon":{}}`, "spec", "prepare", "node_a", "--file", "-", "--patch")
	if !strings.Contains(preparedPatch, `"patch": true`) || !strings.Contains(preparedPatch, `"base_generation": 1`) {
		t.Fatalf("prepared patch %s", preparedPatch)
	}
	_, signedPatch, _ := runCLI(t, ctx, preparedPatch, "sign", "--key", keyPath)
	if code, _, errOut := run(`{"telemetry":{"every":5}}`, "spec", "patch", "node_a", "--file", "-"); code != 0 {
		t.Fatal(errOut)
	}
	if code, _, errOut := run("", "spec", "submit", file("patch.json", signedPatch)); code != cli.ExitFailure || !strings.Contains(errOut, "prepare it again") {
		t.Fatalf("submit of a stale patch: exit %d %q", code, errOut)
	}
	if gen, _, _ := s.Spec("node_a"); gen != 2 {
		t.Errorf("generation %d, want 2", gen)
	}
	if code, _, errOut := run("", "spec", "submit", file("cmd2.json", signed)); code != cli.ExitFailure || !strings.Contains(errOut, "bcgw run --submit") {
		t.Errorf("a command given to spec submit: exit %d %q", code, errOut)
	}
}

// bcgw sign refuses a key others may read, and a file that is not
// prepared, without showing the key.
func TestSignRefusals(t *testing.T) {
	ctx := context.Background()
	keyPath, _, keyPEM, _ := keyFiles(t)
	loose := filepath.Join(t.TempDir(), "loose.pem")
	_ = os.WriteFile(loose, keyPEM, 0o644)
	prepared := `{"id":"cmd_aaaaaaaaaaaaaaaaaaaaa","node_id":"node_a","kind":"agent.ping","lane":"","workflow_id":"","deadline_unix_ms":1}`
	for _, tt := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{prepared, []string{"sign", "--key", loose}, cli.ExitFailure, "chmod 600"},
		{prepared, []string{"sign"}, cli.ExitUsage, "--key is required"},
		{prepared, []string{"sign", "--key", filepath.Join(t.TempDir(), "absent.pem")}, cli.ExitFailure, "--key"},
		{`{"hello":1}`, []string{"sign", "--key", keyPath}, cli.ExitFailure, "not a prepared command"},
		{strings.Replace(prepared, `"lane":""`, `"lane":"","extra":1`, 1), []string{"sign", "--key", keyPath}, cli.ExitFailure, "unknown field"},
		{strings.Replace(prepared, "cmd_a", "cmd-a", 1), []string{"sign", "--key", keyPath}, cli.ExitFailure, "not a command id"},
	} {
		code, out, errOut := runCLI(t, ctx, tt.stdin, tt.args...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("%v: exit %d %q, want %d and %q", tt.args, code, errOut, tt.code, tt.want)
		}
		noKeyIn(t, strings.Join(tt.args, " "), out+errOut, keyPEM)
	}
	// The key given as a public key file is refused, naming the file only.
	code, out, errOut := runCLI(t, ctx, prepared, "sign", "--key", keyPath, "--in", keyPath)
	if code != cli.ExitFailure {
		t.Errorf("the key as --in: exit %d", code)
	}
	noKeyIn(t, "sign --in KEY", out+errOut, keyPEM)
}

// rootsOf are the roots of the server's current trust bundle.
func rootsOf(t *testing.T, s *gateway.Server) *intent.Roots {
	t.Helper()
	r, err := intent.ParseRoots(s.TrustBundle().GetCommandSigningRoots())
	if err != nil {
		t.Fatal(err)
	}
	return r
}
