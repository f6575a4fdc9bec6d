package main

import (
	"context"
	"fmt"
	"os"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// maxEnrollFile bounds an EK public key or EK CA file.
const maxEnrollFile = 64 << 10

const tpmUsage = "usage: bcgw tpm enroll (--ek-pub FILE | --ek-pin sha256/... | --ek-ca FILE) [--site S] [--role node|site]"

// tpmCmd is `bcgw tpm enroll`: which TPMs may join with bcd join --attestor
// tpm, by their EK's public key or pin, or by the CA that issued their EK
// certificates.
func tpmCmd(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) == 0 || args[0] != "enroll" {
		return cli.Usagef(env, "%s", tpmUsage)
	}
	fs := cli.NewFlagSet(env, "bcgw", "tpm enroll")
	var a adminFlags
	a.register(fs)
	ekPub := fs.String("ek-pub", "", "the EK's public key: PEM or DER SubjectPublicKeyInfo (tpm2_readpublic -f pem), or its TPMT_PUBLIC")
	ekPin := fs.String("ek-pin", "", "the EK's SPKI pin, as a refused bcd join --attestor tpm prints it")
	ekCA := fs.String("ek-ca", "", "a CA certificate file (PEM or DER): TPMs whose EK certificate it issued may join")
	site := fs.String("site", "lab", "the site the TPM's node joins")
	role := fs.String("role", "node", "node or site")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
		return code
	}
	req := adminapi.TPMEnrollRequest{EKPin: *ekPin, Site: *site, Role: *role}
	n := 0
	for _, f := range []struct {
		path string
		dst  *[]byte
	}{{*ekPub, &req.EKPublic}, {*ekCA, &req.EKCA}} {
		if f.path == "" {
			continue
		}
		b, err := readSmall(f.path)
		if err != nil {
			return cli.Fail(env, "bcgw tpm enroll", err)
		}
		*f.dst = b
		n++
	}
	if *ekPin != "" {
		n++
	}
	if n != 1 {
		return cli.Usagef(env, "%s", tpmUsage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw tpm enroll", err)
	}
	out, err := c.EnrollTPM(ctx, req)
	if err != nil {
		return cli.Fail(env, "bcgw tpm enroll", err)
	}
	if *asJSON {
		return printJSON(env, out)
	}
	if out.EK != "" {
		fmt.Fprintf(env.Stdout, "enrolled EK %s (site %s, role %s)\n", out.EK, out.Site, out.Role)
	} else {
		fmt.Fprintf(env.Stdout, "enrolled EK CA %q (site %s, role %s)\n", out.EKCA, out.Site, out.Role)
	}
	return 0
}

func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxEnrollFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxEnrollFile)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}
