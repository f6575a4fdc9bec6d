package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	relmanifest "github.com/better-compute/bcd/components/trust/release"
)

// releaseCmd is `bcgw release`: `publish` stores a signed release and its
// binaries; anything else is the GPU hold's `bcgw release NODE --alloc`.
func releaseCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) > 0 && args[0] == "publish" {
		return publish(ctx, env, args[1:])
	}
	if len(args) > 0 && args[0] == "list" {
		return releaseList(ctx, env, args[1:])
	}
	return release(ctx, env, args)
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// publish is `bcgw release publish FILE --artifact PATH...`: the signed
// release document (bcrelease) and the binaries the gateways serve at
// /releases/<sha256>, sent through the admin API. On a gateway with a
// database the release goes into it, so every gateway sharing it serves
// the release.
func publish(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "release publish")
	var a adminFlags
	a.register(fs)
	var arts multiFlag
	fs.Var(&arts, "artifact", "a built binary of the release, served by the gateways; repeat for each")
	const usage = "bcgw release publish FILE --artifact PATH..."
	pos, code, ok := parseInterleaved(fs, env, args, 1, usage)
	if !ok {
		return code
	}
	doc, err := os.ReadFile(pos[0])
	if err != nil {
		return cli.Fail(env, "bcgw release publish", err)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw release publish", err)
	}
	req := adminapi.PublishRequest{Doc: doc}
	for _, f := range arts {
		sum, err := c.UploadArtifact(ctx, f)
		if err != nil {
			return cli.Fail(env, "bcgw release publish", err)
		}
		req.Artifacts = append(req.Artifacts, sum)
	}
	p, err := c.PublishRelease(ctx, req)
	if err != nil {
		return cli.Fail(env, "bcgw release publish", err)
	}
	where := "by this gateway"
	if p.Shared {
		where = "by every gateway on the database"
	}
	fmt.Fprintf(env.Stdout, "published release %s (sequence %d): served %s %s", p.Version, p.Sequence, where, strings.Join(p.Served, ", "))
	if len(p.Elsewhere) > 0 {
		fmt.Fprintf(env.Stdout, "; fetched from their own URLs %s", strings.Join(p.Elsewhere, ", "))
	}
	fmt.Fprintln(env.Stdout)
	if _, m, err := relmanifest.Decode(doc); err == nil {
		if w := expiryWarning(m.Version, m.Expires, time.Now()); w != "" {
			fmt.Fprintf(env.Stderr, "bcgw release publish: warning: %s\n", w)
		}
	}
	return 0
}

// expirySoon is when bcgw warns that a published release expires.
const expirySoon = 7 * 24 * time.Hour

// expiryWarning says that a release has expired or soon will: nodes
// refuse an expired manifest (the freeze defence, docs/update.md), so a
// release still to roll out needs a new manifest before then.
func expiryWarning(version string, expires, now time.Time) string {
	switch left := expires.Sub(now); {
	case left <= 0:
		return fmt.Sprintf("release %s expired at %s: nodes refuse it; sign a new manifest (bcrelease make, a new version and sequence) and publish that", version, expires.UTC().Format(time.RFC3339))
	case left < expirySoon:
		return fmt.Sprintf("release %s expires in %s (%s): nodes refuse it after that; roll it out before, or sign a new manifest and publish that", version, left.Round(time.Minute), expires.UTC().Format(time.RFC3339))
	}
	return ""
}

// releaseList is `bcgw release list [--json]`: the published releases,
// each with its expiry; a warning for each expired or expiring within a
// week.
func releaseList(ctx context.Context, env *cli.Env, args []string) int {
	rs, asJSON, code, ok := fetchView(ctx, env, args, "release list", (*adminapi.Client).Releases)
	if !ok {
		return code
	}
	if asJSON {
		return printJSON(env, rs)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tSEQUENCE\tEXPIRES\tARTIFACTS")
	for _, r := range rs {
		exp := r.Expires.UTC().Format(time.RFC3339)
		if r.Expired {
			exp += " (expired)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", r.Version, r.Sequence, exp, strings.Join(r.Artifacts, ","))
	}
	tw.Flush()
	for _, r := range rs {
		if w := expiryWarning(r.Version, r.Expires, now); w != "" && !r.Expired {
			fmt.Fprintf(env.Stderr, "bcgw release list: warning: %s\n", w)
		}
	}
	return 0
}

// upgrade is `bcgw upgrade NODE|--all --version V`: daemon.upgrade with
// the published release to one node or site agent, or every connected
// one; --wait follows each until it is done, with its progress.
func upgrade(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "upgrade")
	var a adminFlags
	a.register(fs)
	version := fs.String("version", "", "the published release to upgrade to (bcgw release publish)")
	all := fs.Bool("all", false, "every connected node and site agent")
	wait := fs.Bool("wait", false, "wait for each result, showing progress")
	timeout := fs.Duration("timeout", 10*time.Minute, "with --wait, how long to wait")
	const usage = "bcgw upgrade NODE|--all --version V [--wait]"
	pos, code, ok := parseInterleaved(fs, env, args, -1, usage)
	if !ok {
		return code
	}
	if *version == "" || *all == (len(pos) > 0) || len(pos) > 1 {
		return cli.Usagef(env, "usage: %s", usage)
	}
	if err := checkDeadline(*timeout); err != nil { // the command's deadline
		return cli.Usagef(env, "bcgw upgrade: --timeout %v", err)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw upgrade", err)
	}
	doc, err := c.ReleaseDoc(ctx, *version)
	if err != nil {
		return cli.Fail(env, "bcgw upgrade", err)
	}
	targets := pos
	if *all {
		ns, err := c.Nodes(ctx)
		if err != nil {
			return cli.Fail(env, "bcgw upgrade", err)
		}
		for _, n := range ns {
			if n.Connected && !n.Revoked && (n.Role == "node" || n.Role == "site") {
				targets = append(targets, n.ID)
			}
		}
		slices.Sort(targets)
	}
	body, _ := json.Marshal(relmanifest.UpgradeBody{Release: doc})
	var cmds []adminapi.CommandView
	failed := 0
	for _, id := range targets {
		cmd, err := c.Send(ctx, adminapi.CommandRequest{Node: id, Kind: relmanifest.UpgradeKind, Body: body, DeadlineSeconds: int(timeout.Seconds())})
		if err != nil {
			fmt.Fprintf(env.Stderr, "bcgw upgrade: %s: %v\n", id, err)
			failed++
			continue
		}
		fmt.Fprintf(env.Stdout, "%s: daemon.upgrade to %s sent as %s\n", id, *version, cmd.ID)
		cmds = append(cmds, cmd)
	}
	if *wait {
		end := time.Now().Add(*timeout)
		for _, cmd := range cmds {
			last := ""
			for cmd.State != "done" && time.Now().Before(end) {
				if cmd, err = c.Command(ctx, cmd.ID, min(time.Until(end), 2*time.Second)); err != nil {
					return cli.Fail(env, "bcgw upgrade", err)
				}
				if p := string(cmd.Progress); p != "" && p != last {
					last = p
					fmt.Fprintf(env.Stderr, "bcgw upgrade: %s: progress %s\n", cmd.Node, p)
				}
			}
			switch {
			case cmd.State != "done":
				fmt.Fprintf(env.Stdout, "%s: no result within %s\n", cmd.Node, *timeout)
				failed++
			case cmd.Status == "SUCCEEDED":
				fmt.Fprintf(env.Stdout, "%s: SUCCEEDED %s\n", cmd.Node, cmd.Output)
			default:
				fmt.Fprintf(env.Stdout, "%s: %s %s\n", cmd.Node, cmd.Status, cmd.Error)
				failed++
			}
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// upgradeLine is bcgw status's line for the node's latest daemon.upgrade
// (the gateway keeps it): the command's state, its progress while it
// runs, its result when done.
func upgradeLine(u *adminapi.UpgradeView) string {
	if u == nil {
		return ""
	}
	cmd := u.Command
	switch {
	case cmd.State != "done" && len(cmd.Progress) > 0:
		return fmt.Sprintf("to %s (%s): %s, progress %s", u.Version, cmd.ID, cmd.State, cmd.Progress)
	case cmd.State != "done":
		return fmt.Sprintf("to %s (%s): %s", u.Version, cmd.ID, cmd.State)
	case cmd.Status == "SUCCEEDED":
		return fmt.Sprintf("to %s (%s): SUCCEEDED %s", u.Version, cmd.ID, cmd.Output)
	}
	return fmt.Sprintf("to %s (%s): %s %s", u.Version, cmd.ID, cmd.Status, cmd.Error)
}
