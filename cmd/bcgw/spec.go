package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

const specUsage = "usage: bcgw spec set NODE --file F | bcgw spec patch NODE --file F | bcgw spec get NODE | " +
	"bcgw spec prepare NODE --file F [--patch] | bcgw spec submit FILE  (F may be - for stdin)"

// specCmd is `bcgw spec set|patch|get|prepare NODE` and `bcgw spec submit
// FILE`.
func specCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 || !slices.Contains([]string{"set", "patch", "get", "prepare", "submit"}, args[0]) {
		return cli.Usagef(env, "%s", specUsage)
	}
	verb := args[0]
	if verb == "submit" {
		return specSubmit(ctx, env, args[1:])
	}
	fs := cli.NewFlagSet(env, "bcgw", "spec "+verb)
	var a adminFlags
	a.register(fs)
	var file *string
	if verb != "get" {
		file = fs.String("file", "", "the spec (set) or RFC 7396 merge patch (patch), a JSON object; - reads stdin")
	}
	var patch *bool
	if verb == "prepare" {
		patch = fs.Bool("patch", false, "F is an RFC 7396 merge patch, sent as one (default: a full spec)")
	}
	asJSON := fs.Bool("json", false, "set, patch: print {\"generation\": N} instead of N")
	usage := "bcgw spec " + verb + " NODE"
	if file != nil {
		usage += " --file F"
	}
	if patch != nil {
		usage += " [--patch]"
	}
	pos, code, ok := parseInterleaved(fs, env, args[1:], 1, usage)
	if !ok {
		return code
	}
	prefix := "bcgw spec " + verb
	if verb == "get" {
		c, err := a.client()
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		v, err := c.Spec(ctx, pos[0])
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		return printJSON(env, v)
	}
	if *file == "" {
		return cli.Usagef(env, "%s: --file is required (- reads stdin)\nusage: %s", prefix, usage)
	}
	body, err := readSpecFile(env, *file)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	var gen uint64
	if verb == "prepare" {
		p, err := c.PrepareSpec(ctx, pos[0], body, *patch)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		return printJSON(env, p)
	}
	if verb == "set" {
		gen, err = c.SetSpec(ctx, pos[0], body)
	} else {
		gen, err = c.PatchSpec(ctx, pos[0], body)
	}
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if *asJSON {
		return printJSON(env, adminapi.GenerationView{Generation: gen})
	}
	fmt.Fprintln(env.Stdout, gen)
	return 0
}

// specSubmit is `bcgw spec submit FILE`: it stores and sends a prepared
// spec (bcgw spec prepare, signed with bcgw sign or not) as it is.
func specSubmit(ctx context.Context, env *cli.Env, args []string) int {
	const prefix = "bcgw spec submit"
	fs := cli.NewFlagSet(env, "bcgw", "spec submit")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print {\"generation\": N} instead of N")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw spec submit FILE  (FILE may be - for stdin)")
	if !ok {
		return code
	}
	var b []byte
	var err error
	if pos[0] == "-" {
		b, err = io.ReadAll(io.LimitReader(env.Stdin, 16<<20))
	} else {
		b, err = readSmallFile(pos[0], 16<<20)
	}
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	_, sp, err := adminapi.DecodePrepared(b)
	if err == nil && sp == nil {
		err = errors.New("this is a prepared command; send it with bcgw run --submit")
	}
	if err != nil {
		return cli.Fail(env, prefix, fmt.Errorf("%s: %w", pos[0], err))
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	v, err := c.SubmitSpec(ctx, *sp)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if v.Warning != "" {
		fmt.Fprintf(env.Stderr, "%s: warning: %s\n", prefix, v.Warning)
	}
	if *asJSON {
		return printJSON(env, adminapi.GenerationView{Generation: v.Generation})
	}
	fmt.Fprintln(env.Stdout, v.Generation)
	return 0
}

// readSpecFile reads a spec or patch of at most nodespec.MaxBytes from
// path, or from stdin for "-".
func readSpecFile(env *cli.Env, path string) ([]byte, error) {
	var r io.Reader
	name := path
	if path == "-" {
		r, name = env.Stdin, "stdin"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--file: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, nodespec.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--file: %s: %w", name, err)
	}
	if len(b) > nodespec.MaxBytes {
		return nil, fmt.Errorf("--file: %s is larger than %d bytes (4 MiB), the bound of a spec and of a patch", name, nodespec.MaxBytes)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, fmt.Errorf("--file: %s is empty; a spec or patch is a JSON object", name)
	}
	return b, nil
}

func nodeStatus(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "status")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print the status view as JSON")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw status NODE [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw status", err)
	}
	st, err := c.Status(ctx, pos[0])
	if err != nil {
		return cli.Fail(env, "bcgw status", err)
	}
	if *asJSON {
		return printJSON(env, st)
	}
	writeStatus(env.Stdout, st)
	if line := upgradeLine(st.Upgrade); line != "" {
		fmt.Fprintf(env.Stdout, "upgrade   %s\n", line)
	}
	return 0
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeStatus prints a status view for people.
func writeStatus(w io.Writer, v adminapi.StatusView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node\t%s (%s, site %s)\n", v.Node, v.Role, v.Site)
	conn := "not connected"
	if v.Connected {
		conn = "connected"
		if v.Gateway != "" {
			conn += " to gateway " + v.Gateway
		}
	}
	fmt.Fprintf(tw, "session\t%s, last seen %s\n", conn, stamp(v.LastSeen))
	spec := "none"
	if v.SpecGeneration > 0 {
		spec = fmt.Sprintf("generation %d", v.SpecGeneration)
	}
	fmt.Fprintf(tw, "spec\t%s; the agent holds %d, observed %d\n", spec, v.AppliedGeneration, v.ObservedGeneration)
	if v.RefusedGeneration > 0 || v.SpecError != "" {
		fmt.Fprintf(tw, "refused\tgeneration %d: %s\n", v.RefusedGeneration, orDash(v.SpecError))
	}
	if v.ReportAt != nil {
		fmt.Fprintf(tw, "report\treceived %s\n", stamp(*v.ReportAt))
	} else {
		fmt.Fprintf(tw, "report\tnone yet\n")
	}
	if p := v.Pressure; p != nil {
		if p.Available {
			fmt.Fprintf(tw, "pressure\tcpu some %.2f/%.2f (avg10/avg60), memory some %.2f full %.2f, io some %.2f full %.2f, cpu steal %.1f%%\n",
				p.CPUSomeAvg10, p.CPUSomeAvg60, p.MemorySomeAvg10, p.MemoryFullAvg10, p.IOSomeAvg10, p.IOFullAvg10, p.CPUStealPercent)
		} else {
			fmt.Fprintf(tw, "pressure\tnot available\n")
		}
	}
	if len(v.InventoryHashes) > 0 {
		names := make([]string, 0, len(v.InventoryHashes))
		for k := range v.InventoryHashes {
			names = append(names, k)
		}
		slices.Sort(names)
		at := ""
		if v.InventoryHashesAt != nil {
			at = " (" + stamp(*v.InventoryHashesAt) + ")"
		}
		fmt.Fprintf(tw, "inventory\t%d sections%s\n", len(names), at)
		for _, k := range names {
			fmt.Fprintf(tw, "  %s\t%s\n", k, v.InventoryHashes[k])
		}
	}
	tw.Flush()
	if len(v.Sections) > 0 {
		fmt.Fprintln(w, "\nsections")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tSTATE\tGENERATION\tMESSAGE")
		for _, s := range v.Sections {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", s.Name, s.State, s.Generation, orDash(s.Message))
			for _, c := range s.Changes {
				fmt.Fprintf(tw, "  \t\t\tchange: %s\n", c)
			}
		}
		tw.Flush()
	}
	if len(v.Conditions) > 0 {
		fmt.Fprintln(w, "\nconditions")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  TYPE\tSUBJECT\tREASON\tCOUNT\tSINCE\tMESSAGE")
		for _, c := range v.Conditions {
			since := "-"
			if c.Since != nil {
				since = stamp(*c.Since)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\n", c.Type, orDash(c.Subject), orDash(c.Reason), c.Count, since, orDash(c.Message))
		}
		tw.Flush()
	}
	if len(v.Report) > 0 && !bytes.Equal(bytes.TrimSpace(v.Report), []byte("{}")) {
		var buf bytes.Buffer
		if json.Indent(&buf, v.Report, "", "  ") == nil {
			fmt.Fprintf(w, "\nrole report\n%s\n", buf.String())
		}
	}
}

func events(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "events")
	var a adminFlags
	a.register(fs)
	follow := fs.Bool("follow", false, "keep printing new events (polled every second) until interrupted")
	asJSON := fs.Bool("json", false, "print each event as one JSON object per line")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw events NODE [--follow] [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw events", err)
	}
	var after uint64
	header := !*asJSON
	for {
		// Each poll is bounded; an interrupt ends the loop between polls.
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		evs, err := c.Events(pctx, pos[0], after)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			return cli.Fail(env, "bcgw events", err)
		}
		if len(evs) > 0 {
			after = evs[len(evs)-1].Seq
		}
		if err := writeEvents(env.Stdout, evs, *asJSON, header); err != nil {
			return cli.Fail(env, "bcgw events", err)
		}
		header = false
		if !*follow {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(time.Second):
		}
	}
}

// writeEvents prints events as text lines (with a header first when
// header is set) or as JSON lines.
func writeEvents(w io.Writer, evs []adminapi.EventView, asJSON, header bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		for _, e := range evs {
			if err := enc.Encode(e); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if header {
		fmt.Fprintln(tw, "SEQ\tAT\tTYPE\tBODY")
	}
	for _, e := range evs {
		body := strings.TrimSpace(string(e.Body))
		if e.BodyDropped > 0 {
			body = fmt.Sprintf("(%d bytes, not kept)", e.BodyDropped)
		}
		at := e.At
		if at.IsZero() {
			at = e.ReceivedAt
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", e.Seq, stamp(at), orDash(e.Type), orDash(body))
	}
	return tw.Flush()
}
