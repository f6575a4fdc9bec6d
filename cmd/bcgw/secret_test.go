package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/cli"
)

// TestSecretCommand: bcgw secret set takes the value from a file or
// stdin, never an argument (there is no flag for it, and a positional
// value is a usage error), names the canonical secret it stored, lists
// names without values, deletes; an unknown name is refused with the
// gateway's error, which holds no value.
func TestSecretCommand(t *testing.T) {
	_, dir := startServer(t)
	ctx := context.Background()
	const value = "Bearer cli-s3cret-value"
	f := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(f, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var outs []string
	run := func(stdin string, args ...string) (int, string) {
		t.Helper()
		code, out, errOut := runCLI(t, ctx, stdin, append(args, "--data-dir", dir)...)
		outs = append(outs, out, errOut)
		return code, out + errOut
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"secret"}, cli.ExitUsage, "usage: bcgw secret set"},
		{[]string{"secret", "set", "telemetry-header/Authorization"}, cli.ExitUsage, "--value-file FILE (or - for stdin) is required"},
		{[]string{"secret", "set", "telemetry-header/Authorization", value}, cli.ExitUsage, "usage: bcgw secret set"},
		{[]string{"secret", "set", "bmc-credentials", "--value-file", f}, cli.ExitFailure, "no settable secret \"bmc-credentials\""},
		{[]string{"secret", "set", "telemetry-header/authorization", "--value-file", f}, 0, "set telemetry-header/Authorization for the fleet"},
		{[]string{"secret", "set", "telemetry-header/X-Key", "--node", "node_a", "--value-file", "-"}, 0, "set telemetry-header/X-Key for node node_a"},
		{[]string{"secret", "set", "telemetry-header/X-Key", "--node", "node_zz", "--value-file", f}, cli.ExitFailure, "node node_zz"},
		{[]string{"secret", "list"}, 0, "telemetry-header/X-Key          node node_a"},
		{[]string{"secret", "delete", "telemetry-header/X-Key", "--node", "node_a"}, 0, "deleted telemetry-header/X-Key for node node_a"},
		{[]string{"secret", "delete", "telemetry-header/X-Key", "--node", "node_a"}, cli.ExitFailure, "no secret telemetry-header/X-Key for node node_a"},
	} {
		code, out := run(value+"\n", c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("bcgw %v: exit %d %q; want %d and %q", c.args, code, out, c.code, c.want)
		}
	}
	for i, o := range outs {
		if strings.Contains(o, "cli-s3cret") {
			t.Errorf("output %d holds the value: %q", i, o)
		}
	}
}
