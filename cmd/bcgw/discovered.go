package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// discovered is `bcgw discovered SITE [--json]`: the machines that asked
// the site to boot and that nobody prepared, from its latest report.
func discovered(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "discovered")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw discovered SITE [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw discovered", err)
	}
	st, err := c.Status(ctx, pos[0])
	if err != nil {
		return cli.Fail(env, "bcgw discovered", err)
	}
	if st.Role != "site" {
		return cli.Fail(env, "bcgw discovered", fmt.Errorf("%s is a %s, not a site agent", pos[0], st.Role))
	}
	var at time.Time
	if st.ReportAt != nil {
		at = *st.ReportAt
	}
	list, dropped := adminapi.Discovered(st.Report, at)
	if dropped > 0 {
		fmt.Fprintf(env.Stderr, "bcgw discovered: %d entries of the site's report are not well-formed and are left out\n", dropped)
	}
	if *asJSON {
		if list == nil {
			list = []adminapi.DiscoveredView{}
		}
		return printJSON(env, list)
	}
	if len(list) == 0 {
		fmt.Fprintf(env.Stdout, "no unprepared machine has asked %s to boot (report %s)\n", pos[0], stamp(at))
		return 0
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MAC\tARCH\tFIRST SEEN\tLAST SEEN\tTIMES")
	for _, d := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", d.MAC, orDash(d.Arch), stamp(d.FirstSeen), stamp(d.LastSeen), d.Count)
	}
	tw.Flush()
	return 0
}
