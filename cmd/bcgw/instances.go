package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/vm/instances"
)

// instancesView is what `bcgw instances --json` prints.
type instancesView struct {
	Node     string                   `json:"node"`
	ReportAt *time.Time               `json:"report_at,omitempty"`
	Complete bool                     `json:"complete"`
	Domains  []instances.ReportDomain `json:"domains"`
	Failed   map[string]string        `json:"failed,omitempty"`
}

// instancesCmd is `bcgw instances NODE [--json]`: every domain the node's
// runtime lists (bcd's and others') and why instances failed, from its
// latest report.
func instancesCmd(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "instances")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw instances NODE [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw instances", err)
	}
	st, err := c.Status(ctx, pos[0])
	if err != nil {
		return cli.Fail(env, "bcgw instances", err)
	}
	v := instancesView{Node: pos[0], ReportAt: st.ReportAt, Domains: []instances.ReportDomain{}}
	var rep struct {
		Instances *instances.Report `json:"instances"`
	}
	if len(bytes.TrimSpace(st.Report)) > 0 {
		if err := json.Unmarshal(st.Report, &rep); err != nil {
			return cli.Fail(env, "bcgw instances", fmt.Errorf("the node's report does not read: %w", err))
		}
	}
	if rep.Instances == nil {
		return cli.Fail(env, "bcgw instances", fmt.Errorf("%s has reported no instances (it runs no instances section)", pos[0]))
	}
	v.Complete, v.Failed = rep.Instances.Complete, rep.Instances.Failed
	if rep.Instances.Domains != nil {
		v.Domains = rep.Instances.Domains
	}
	if *asJSON {
		return printJSON(env, v)
	}
	var at time.Time
	if v.ReportAt != nil {
		at = *v.ReportAt
	}
	if !v.Complete {
		fmt.Fprintf(env.Stdout, "the runtime of %s could not list its domains (report %s); this list may lack some\n", pos[0], stamp(at))
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tBCD'S\tFAILED")
	seen := map[string]bool{}
	for _, d := range v.Domains {
		seen[d.ID] = true
		owned := "yes"
		if !d.Owned {
			owned = "no (not touched)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.ID, d.State, owned, orDash(v.Failed[d.ID]))
	}
	var undefined []string
	for id := range v.Failed {
		if !seen[id] {
			undefined = append(undefined, id)
		}
	}
	sort.Strings(undefined)
	for _, id := range undefined {
		fmt.Fprintf(tw, "%s\t-\t-\t%s\n", id, v.Failed[id])
	}
	tw.Flush()
	return 0
}
