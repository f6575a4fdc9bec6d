package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/better-compute/bcd/components/base/cli"
)

// tokenLsRm is `bcgw token ls [--json]` and `bcgw token rm ID`.
func tokenLsRm(ctx context.Context, env *cli.Env, args []string) int {
	verb := args[0]
	prefix := "bcgw token " + verb
	fs := cli.NewFlagSet(env, "bcgw", "token "+verb)
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	npos, usage := 0, "bcgw token ls [--json]"
	if verb == "rm" {
		npos, usage = 1, "bcgw token rm ID [--json]"
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], npos, usage)
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if verb == "rm" {
		if err := c.RemoveJoinToken(ctx, pos[0]); err != nil {
			return cli.Fail(env, prefix, err)
		}
		if *asJSON {
			return printJSON(env, map[string]string{"removed": pos[0]})
		}
		fmt.Fprintf(env.Stdout, "removed join token %s\n", pos[0])
		return 0
	}
	ts, err := c.JoinTokens(ctx)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if *asJSON {
		return printJSON(env, ts)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOKEN\tROLE\tSITE\tUSED\tCREATED\tEXPIRES\tSTATE\tFOR")
	for _, t := range ts {
		state := "usable"
		switch {
		case t.Spent:
			state = "spent"
		case t.Expired:
			state = "expired"
		}
		exp := "never"
		if !t.ExpiresAt.IsZero() {
			exp = stamp(t.ExpiresAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", t.ID, t.Role, t.Site, t.Used, t.Uses, stamp(t.CreatedAt), exp, state,
			orDash(t.NodeID+t.MAC))
	}
	tw.Flush()
	return 0
}

// nodeCmd is `bcgw node rm NODE [--json]`.
func nodeCmd(ctx context.Context, env *cli.Env, args []string) int {
	const usage = "bcgw node rm NODE [--json]"
	if len(args) == 0 || args[0] != "rm" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(env.Stderr, "usage: "+usage)
			return 0
		}
		return cli.Usagef(env, "usage: %s", usage)
	}
	fs := cli.NewFlagSet(env, "bcgw", "node rm")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, code, ok := parseInterleaved(fs, env, args[1:], 1, usage)
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw node rm", err)
	}
	if err := c.RemoveNode(ctx, pos[0]); err != nil {
		return cli.Fail(env, "bcgw node rm", err)
	}
	if *asJSON {
		return printJSON(env, map[string]string{"removed": pos[0]})
	}
	fmt.Fprintf(env.Stdout, "removed node %s\n", pos[0])
	return 0
}
