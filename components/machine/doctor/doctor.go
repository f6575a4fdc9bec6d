// Package doctor is `bcd doctor`: a list of independent checks of this
// machine and its configuration, each ok, warn or fail, printed one line
// per check. Any failed check makes the command exit 1.
//
// Each check is built by a constructor that takes what it needs, so the
// role's main chooses the list and tests fake what a check reads. Checks of
// the host read through an unexported twin that takes a root directory, so
// tests run them against fake trees.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
)

// Status is a check's verdict.
type Status string

// Statuses.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is what one check found.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
}

// Check is one named check. Run gives its one result; a check with one
// result per item (one gpu line per GPU) sets Many instead, which may give
// none.
type Check struct {
	Name string
	Run  func(ctx context.Context) Result
	Many func(ctx context.Context) []Result
}

// Column widths of the printed lines.
const (
	statusWidth = 6
	nameWidth   = 10
)

// Run runs checks in order, printing each result as a line to w as soon as
// it is known, and reports whether any failed.
func Run(ctx context.Context, checks []Check, w io.Writer) (failed bool) {
	for _, c := range checks {
		for _, r := range runOne(ctx, c) {
			fmt.Fprint(w, Format(r))
			failed = failed || r.Status == Fail
		}
	}
	return failed
}

// Collect runs checks in order and returns their results.
func Collect(ctx context.Context, checks []Check) []Result {
	out := make([]Result, 0, len(checks))
	for _, c := range checks {
		out = append(out, runOne(ctx, c)...)
	}
	return out
}

// runOne runs c and returns its results, each named after it and kept
// on one line. A check with neither Run nor Many fails, as does an
// unknown status.
func runOne(ctx context.Context, c Check) []Result {
	switch {
	case c.Many != nil:
		rs := c.Many(ctx)
		for i := range rs {
			rs[i] = normalize(c, rs[i])
		}
		return rs
	case c.Run == nil:
		return []Result{{Name: c.Name, Status: Fail, Detail: "check has nothing to run"}}
	}
	return []Result{normalize(c, c.Run(ctx))}
}

func normalize(c Check, r Result) Result {
	if r.Name == "" {
		r.Name = c.Name
	}
	switch r.Status {
	case OK, Warn, Fail:
	default:
		r.Detail = fmt.Sprintf("check returned status %q: %s", r.Status, r.Detail)
		r.Status = Fail
	}
	r.Detail = oneLine(r.Detail)
	return r
}

// Format returns r as a printed line: the status padded to 6 columns, the
// name to 10 (with at least one space after it), the detail and a newline.
func Format(r Result) string {
	name := r.Name
	if len(name) < nameWidth {
		name += strings.Repeat(" ", nameWidth-len(name))
	} else {
		name += " "
	}
	line := fmt.Sprintf("%-*s%s%s", statusWidth, r.Status, name, r.Detail)
	return strings.TrimRight(line, " ") + "\n"
}

// oneLine replaces control characters (newlines from a wrapped command's
// output among them) with spaces.
func oneLine(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s))
}

// Command returns `bcd doctor [--config PATH] [--json]`. It loads the
// configuration (nil when it does not load: the config check reports why)
// and runs the checks the role's main builds from it; path is the file
// named by --config. It exits 1 when any check fails. --json prints the
// results as one JSON array instead of lines.
func Command(checks func(cfg *config.Config, path string) []Check) cli.Command {
	return cli.Command{Name: "doctor", Summary: "check this machine and its configuration", Run: func(ctx context.Context, env *cli.Env, args []string) int {
		flags := cli.NewFlagSet(env, "bcd", "doctor")
		path := flags.String("config", config.DefaultPath, "the configuration file")
		asJSON := flags.Bool("json", false, "print the results as a JSON array")
		if code, ok := cli.Parse(flags, env, args, ""); !ok {
			return code
		}
		cfg, err := config.Load(*path)
		if err != nil {
			cfg = nil
		}
		var list []Check
		if checks != nil {
			list = checks(cfg, *path)
		}
		var failed bool
		if *asJSON {
			results := Collect(ctx, list)
			for _, r := range results {
				failed = failed || r.Status == Fail
			}
			b, err := json.MarshalIndent(results, "", "  ")
			if err != nil {
				return cli.Fail(env, "bcd doctor", fmt.Errorf("encode results: %w", err))
			}
			fmt.Fprintf(env.Stdout, "%s\n", b)
		} else {
			failed = Run(ctx, list, env.Stdout)
		}
		if failed {
			return cli.ExitFailure
		}
		return cli.ExitOK
	}}
}
