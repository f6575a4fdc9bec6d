//go:build helpere2e

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
)

// e2eCommands adds helper-call, which the root end-to-end test runs as an
// unprivileged user: it sends one JSON request from standard input to the
// helper and prints the answer. It is not in a release build.
func e2eCommands() []cli.Command {
	return []cli.Command{{Name: "helper-call", Summary: "send one JSON request from stdin to bcd helper (helpere2e builds only)", Run: call}}
}

func call(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcd", "helper-call")
	path := fs.String("config", config.DefaultPath, "the configuration file naming [helper] socket")
	socket := fs.String("socket", "", "the helper's socket (instead of the configuration's)")
	raw := fs.Bool("raw", false, "send standard input as it is, unchecked, and print the answer as it is")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	const prefix = "bcd helper-call"
	if *socket == "" {
		cfg, err := config.Load(*path)
		if err != nil {
			return cli.Fail(env, prefix, err)
		}
		*socket = cfg.Helper.Socket
	}
	data, err := io.ReadAll(io.LimitReader(env.Stdin, wire.MaxRequest+1))
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	if *raw {
		return sendRaw(ctx, env, *socket, data)
	}
	req, err := wire.DecodeRequest(data)
	if err != nil {
		return cli.Fail(env, prefix, err)
	}
	c := &helperclient.Client{Socket: *socket}
	resp, err := c.Do(ctx, req)
	var herr *helperclient.Error
	if err != nil && !errors.As(err, &herr) {
		return cli.Fail(env, prefix, err)
	}
	fmt.Fprintf(env.Stdout, "%s\n", wire.EncodeResponse(resp))
	if !resp.OK {
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// sendRaw sends data unchecked, so the end-to-end test can show what the
// helper itself refuses, and prints the answer unchecked.
func sendRaw(ctx context.Context, env *cli.Env, socket string, data []byte) int {
	ctx, cancel := context.WithTimeout(ctx, helperclient.Timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return cli.Fail(env, "bcd helper-call", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	c.Write(data)
	c.(*net.UnixConn).CloseWrite()
	answer, _ := io.ReadAll(io.LimitReader(c, wire.MaxResponse+1))
	fmt.Fprintf(env.Stdout, "%s\n", answer)
	if resp, err := wire.DecodeResponse(answer); err != nil || !resp.OK {
		return cli.ExitFailure
	}
	return cli.ExitOK
}
