package main

import (
	"context"
	"fmt"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// health prints this gateway's health: its sessions and whether its
// database answers. It exits 1 when the database does not, so a script
// or a monitoring check can read the exit code (docs/gateway-store.md).
func health(ctx context.Context, env *cli.Env, args []string) int {
	h, asJSON, code, ok := fetchView(ctx, env, args, "health", (*adminapi.Client).Health)
	if !ok {
		return code
	}
	if !h.Database.Reachable {
		code = cli.ExitFailure
	}
	if asJSON {
		if c := printJSON(env, h); c != 0 {
			return c
		}
		return code
	}
	fmt.Fprintf(env.Stdout, "gateway   %s (bcgw %s), %d sessions\n", h.ServerName, h.Version, h.Sessions)
	if h.Database.Reachable {
		fmt.Fprintf(env.Stdout, "database  %s answers (since %s, checked %s)\n", h.Database.Backend, stamp(h.Database.Since), stamp(h.Database.Checked))
	} else {
		fmt.Fprintf(env.Stdout, "database  %s UNREACHABLE since %s (checked %s): %s\n", h.Database.Backend, stamp(h.Database.Since), stamp(h.Database.Checked), h.Database.Error)
		fmt.Fprintf(env.Stdout, "          this gateway's agents cannot store results or events; %s answers 503 so a balancer sends them elsewhere\n", adminapi.ReadyPath)
	}
	return code
}
