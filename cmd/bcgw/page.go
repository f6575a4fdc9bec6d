package main

import (
	"context"
	"fmt"
	"html/template"
	"os"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
)

// page is `bcgw page [--json] [--html FILE]`: a one-time link to the fleet
// page on the loopback admin listener. --html writes it into a 0600 HTML
// file that sends a browser on to it, so the link (a secret until it is
// opened) need not be in the browser's arguments.
func page(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "page")
	var a adminFlags
	a.register(fs)
	j := fs.Bool("json", false, "print JSON ({\"url\", \"expires_at\"})")
	htmlFile := fs.String("html", "", "write an HTML file (mode 0600) that opens the link, and print its path instead")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw page", err)
	}
	l, err := c.PageLink(ctx)
	if err != nil {
		return cli.Fail(env, "bcgw page", err)
	}
	if *htmlFile != "" {
		var b strings.Builder
		if err := redirectTemplate.Execute(&b, l.URL); err != nil {
			return cli.Fail(env, "bcgw page", err)
		}
		if err := os.WriteFile(*htmlFile, []byte(b.String()), 0o600); err != nil {
			return cli.Fail(env, "bcgw page", err)
		}
		fmt.Fprintln(env.Stdout, *htmlFile)
		return 0
	}
	if *j {
		return printJSON(env, l)
	}
	fmt.Fprintln(env.Stdout, l.URL)
	fmt.Fprintf(env.Stderr, "bcgw page: open it once, before %s; it sets the page's cookie\n", l.ExpiresAt.Format(time.RFC3339))
	return 0
}

var redirectTemplate = template.Must(template.New("redirect").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="0; url={{.}}"><title>bcgw fleet</title></head>
<body><p><a href="{{.}}">the fleet page</a></p></body></html>
`))
