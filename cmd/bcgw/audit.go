package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

const adminTokenUsage = "usage: bcgw admin-token create NAME [--json] | ls [--json] | rm NAME"

// adminTokenCmd is `bcgw admin-token create|ls|rm`: named admin tokens
// for the loopback admin listener, each the actor of what it does in the
// audit trail.
func adminTokenCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprintln(env.Stderr, adminTokenUsage)
		if len(args) == 0 {
			return cli.ExitUsage
		}
		return 0
	}
	verb := args[0]
	prefix := "bcgw admin-token " + verb
	fs := cli.NewFlagSet(env, "bcgw", "admin-token "+verb)
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	npos, usage := 0, ""
	switch verb {
	case "create":
		npos, usage = 1, "bcgw admin-token create NAME [--json]"
	case "ls":
		npos, usage = 0, "bcgw admin-token ls [--json]"
	case "rm":
		npos, usage = 1, "bcgw admin-token rm NAME"
	default:
		return cli.Usagef(env, "bcgw admin-token: unknown verb %q\n%s", verb, adminTokenUsage)
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], npos, usage)
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	switch verb {
	case "create":
		t, err := c.CreateAdminToken(ctx, pos[0])
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, t)
		}
		fmt.Fprintln(env.Stdout, t.Token)
		fmt.Fprintf(env.Stderr, "%s: shown once; use it with --admin URL --admin-token-file FILE\n", prefix)
	case "ls":
		ts, err := c.AdminTokens(ctx)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, ts)
		}
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCREATED\tBY")
		for _, t := range ts {
			created, by := stamp(t.CreatedAt), orDash(t.CreatedBy)
			if t.Default {
				created, by = "at every start (DATA/admin.token)", "bcgw serve"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Name, created, by)
		}
		tw.Flush()
	case "rm":
		if err := c.RemoveAdminToken(ctx, pos[0]); err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, map[string]any{"removed": pos[0]})
		}
		fmt.Fprintf(env.Stdout, "removed admin token %s\n", pos[0])
	}
	return 0
}

// audit is `bcgw audit [--json] [--after SEQ] [--limit N]`: the admin
// API calls that changed (or tried to change) state, oldest first.
func audit(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "audit")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	after := fs.Uint64("after", 0, "only the entries after this seq")
	limit := fs.Int("limit", 0, "at most this many entries (0: all)")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw audit", err)
	}
	es, err := c.Audit(ctx, *after, *limit)
	if err != nil {
		return cli.Fail(env, "bcgw audit", err)
	}
	if *asJSON {
		if es == nil {
			es = []adminapi.AuditView{}
		}
		return printJSON(env, es)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tAT\tACTOR\tACTION\tTARGET\tSTATUS\tGATEWAY")
	for _, e := range es {
		st := fmt.Sprint(e.Status)
		if e.Error != "" {
			st += " " + e.Error
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Seq, stamp(e.At), e.Actor, e.Action, orDash(e.Target), st, orDash(e.Gateway))
	}
	tw.Flush()
	return 0
}
