package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// sshCA is `bcgw ssh-ca [NODE ...] [--account A ...] [--revoke SERIAL ...]`:
// makes the SSH user CA on first use and prints its public key; with
// nodes, puts it, the exec-ticket JWKS, the principals NODE:ACCOUNT of
// each account and the revoked serials into their access sections.
func sshCA(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "ssh-ca")
	var a adminFlags
	a.register(fs)
	var accounts, revoke stringsFlag
	fs.Var(&accounts, "account", "a local account given the principal NODE:ACCOUNT on each node; repeat for each")
	fs.Var(&revoke, "revoke", "a certificate serial to revoke (the KRL); repeat for each")
	jwksOnly := fs.Bool("jwks-only", false, "put only the exec-ticket JWKS into the nodes' access sections (tunnels and consoles, no SSH CA)")
	jsonOut := fs.Bool("json", false, "print the public key and generations as JSON")
	const usage = "bcgw ssh-ca [NODE ...] [--account ACCOUNT ...] [--revoke SERIAL ...] [--jwks-only] [--json]"
	nodes, code, ok := parseInterleaved(fs, env, args, -1, usage)
	if !ok {
		return code
	}
	req := adminapi.SSHCARequest{Nodes: nodes, Accounts: accounts, JWKSOnly: *jwksOnly}
	if *jwksOnly && (len(accounts) > 0 || len(revoke) > 0) {
		return cli.Usagef(env, "bcgw ssh-ca: --jwks-only takes no --account or --revoke")
	}
	for _, r := range revoke {
		n, err := strconv.ParseUint(r, 10, 64)
		if err != nil || n == 0 {
			return cli.Usagef(env, "bcgw ssh-ca: --revoke %q is not a serial (1 and up)", r)
		}
		req.Revoke = append(req.Revoke, n)
	}
	if len(nodes) == 0 && (len(accounts) > 0 || len(revoke) > 0) {
		return cli.Usagef(env, "bcgw ssh-ca: --account and --revoke need at least one NODE\nusage: %s", usage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw ssh-ca", err)
	}
	v, err := c.SSHCA(ctx, req)
	if err != nil {
		return cli.Fail(env, "bcgw ssh-ca", err)
	}
	if *jsonOut {
		return printJSON(env, v)
	}
	fmt.Fprintln(env.Stdout, v.PublicKey)
	for _, n := range nodes {
		fmt.Fprintf(env.Stderr, "%s: access section at generation %d\n", n, v.Generations[n])
	}
	return 0
}

// sshSign is `bcgw ssh-sign --principal P --pubkey F [--ttl D] [--out F]`:
// a short-lived user certificate of the CA for one principal.
func sshSign(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "ssh-sign")
	var a adminFlags
	a.register(fs)
	principal := fs.String("principal", "", "the principal, NODE:ACCOUNT (bcgw ssh-ca --account)")
	pubkey := fs.String("pubkey", "", "the user's public key file (id_ed25519.pub)")
	ttl := fs.Duration("ttl", adminapi.DefaultCertTTL, "how long the certificate is valid (at most "+adminapi.MaxCertTTL.String()+")")
	out := fs.String("out", "", "write the certificate here (default: beside --pubkey as NAME-cert.pub; - for standard output)")
	const usage = "bcgw ssh-sign --principal NODE:ACCOUNT --pubkey FILE [--ttl 15m] [--out FILE]"
	if _, code, ok := parseInterleaved(fs, env, args, 0, usage); !ok {
		return code
	}
	if *principal == "" || *pubkey == "" {
		return cli.Usagef(env, "bcgw ssh-sign: --principal and --pubkey are needed\nusage: %s", usage)
	}
	if *ttl < time.Second || *ttl > adminapi.MaxCertTTL {
		return cli.Usagef(env, "bcgw ssh-sign: --ttl must be from 1s to %s", adminapi.MaxCertTTL)
	}
	pub, err := readSmallFile(*pubkey, 16<<10)
	if err != nil {
		return cli.Fail(env, "bcgw ssh-sign", err)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw ssh-sign", err)
	}
	v, err := c.SSHSign(ctx, adminapi.SSHSignRequest{Principal: *principal, PublicKey: string(pub), TTLSeconds: int64(ttl.Seconds())})
	if err != nil {
		return cli.Fail(env, "bcgw ssh-sign", err)
	}
	dest := *out
	if dest == "" {
		dest = certPath(*pubkey)
	}
	if dest == "-" {
		fmt.Fprintln(env.Stdout, v.Certificate)
		return 0
	}
	if err := os.WriteFile(dest, []byte(v.Certificate+"\n"), 0o644); err != nil {
		return cli.Fail(env, "bcgw ssh-sign", err)
	}
	fmt.Fprintf(env.Stdout, "%s (serial %d, valid until %s)\n", dest, v.Serial, time.Unix(v.ValidBefore, 0).UTC().Format(time.RFC3339))
	return 0
}

// certPath is where ssh looks for key.pub's certificate: key-cert.pub.
func certPath(pub string) string {
	if len(pub) > 4 && pub[len(pub)-4:] == ".pub" {
		return pub[:len(pub)-4] + "-cert.pub"
	}
	return pub + "-cert.pub"
}
