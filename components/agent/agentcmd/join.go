// Package agentcmd holds the bcd subcommands shared by the agent roles:
// `bcd join` and the agent modes (`bcd node`, `bcd site`) that run the
// session. A role's main picks the ones it has.
package agentcmd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
	"github.com/better-compute/bcd/components/helper/anchor"
	"github.com/better-compute/bcd/components/trust/cloudiid"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
	"github.com/better-compute/bcd/components/trust/pki"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/trust/wellknown"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
	"github.com/better-compute/bcd/proto/gen/bcd/v1/bcdv1connect"
)

// MaxTokenSize bounds a join token read from stdin or a file.
const MaxTokenSize = 4 << 10

const tokenHint = "bcd join reads the join token from BCD_JOIN_TOKEN, stdin or --token-file, never from arguments"

// Join returns `bcd join`.
func Join() cli.Command {
	return cli.Command{Name: "join", Summary: "join this machine to the fleet", Run: runJoin}
}

type joinFlags struct {
	config, role, tokenFile, nodeID, server, attestor string
	servingPin, signingPin, encPin, dataDir           string
	reset, yes                                        bool
	timeout                                           time.Duration
}

func runJoin(ctx context.Context, env *cli.Env, args []string) int {
	// The token leaves the environment before anything else happens.
	envToken := env.Getenv("BCD_JOIN_TOKEN")
	_ = env.Unsetenv("BCD_JOIN_TOKEN")

	var f joinFlags
	fs := cli.NewFlagSet(env, "bcd", "join")
	fs.StringVar(&f.config, "config", config.DefaultPath, "the configuration file; with --server, the file to write when it does not exist")
	fs.StringVar(&f.role, "role", "node", "node or site; the token decides what is allowed")
	fs.StringVar(&f.tokenFile, "token-file", "", "read the token from this file (regular, mode 0600 or 0400, at most 4 KiB); removed once joined")
	fs.StringVar(&f.nodeID, "node-id", "", "the node an installed OS must join as (provisioned attestor)")
	fs.StringVar(&f.server, "server", "", "the control plane URL (https://): its well-known document bootstraps config.toml and the join key")
	fs.StringVar(&f.attestor, "attestor", "join-token", "join-token; tpm (the host's TPM, no token); cloud-iid (an EC2 instance's signed identity, no token); provisioned (implied by --node-id)")
	fs.StringVar(&f.servingPin, "serving-ca-pin", "", "sha256/...: required with --server and no config.toml; must equal serving_ca_spki_pin")
	fs.StringVar(&f.signingPin, "join-signing-pin", "", "sha256/...: same, for join_signing_key_pin")
	fs.StringVar(&f.encPin, "join-encryption-pin", "", "sha256/...: same, for join_encryption_key_pin")
	fs.StringVar(&f.dataDir, "data-dir", "/var/lib/bcd", "the data_dir a configuration written by bcd join names")
	fs.BoolVar(&f.reset, "reset", false, "move this node's identity and journal aside first, so it joins again")
	fs.BoolVar(&f.yes, "yes", false, "confirm --reset")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up when not joined within this long (0: after the attempts run out)")
	if code, ok := cli.Parse(fs, env, args, tokenHint); !ok {
		return code
	}
	if f.role != "node" && f.role != "site" {
		return cli.Usagef(env, "bcd join: --role must be node or site")
	}
	switch f.attestor {
	case "join-token":
	case "tpm", "cloud-iid":
		if f.tokenFile != "" {
			return cli.Usagef(env, "bcd join: --attestor %s takes no --token-file", f.attestor)
		}
	case "provisioned":
		if f.nodeID == "" {
			return cli.Usagef(env, "bcd join: --attestor provisioned needs --node-id")
		}
	default:
		return cli.Usagef(env, "bcd join: --attestor must be join-token, tpm, cloud-iid or provisioned")
	}
	if f.nodeID != "" {
		// --node-id implies the provisioned attestor (an installed OS).
		if f.attestor != "join-token" && f.attestor != "provisioned" {
			return cli.Usagef(env, "bcd join: --node-id joins with the provisioned attestor, not %s", f.attestor)
		}
		if f.role != "node" {
			return cli.Usagef(env, "bcd join: --node-id joins as role node")
		}
		f.attestor = "provisioned"
	}
	for name, p := range map[string]string{"--serving-ca-pin": f.servingPin, "--join-signing-pin": f.signingPin, "--join-encryption-pin": f.encPin} {
		if p != "" {
			if _, err := pki.ParsePin(p); err != nil {
				return cli.Usagef(env, "bcd join: %s: %v", name, err)
			}
		}
	}

	cfg, doc, jwk, bootstrapped, code := loadOrBootstrap(ctx, env, &f)
	if code != 0 {
		return code
	}
	log, err := logging.New(env.Stderr, cfg.Log.Level, cfg.Log.Format, "join")
	if err != nil {
		return cli.Fail(env, "bcd join", err)
	}
	if isTerminal(env.Stderr) {
		// A person watching: one plain line per retry, not JSON.
		log = slog.New(&lineHandler{w: env.Stderr, prefix: "bcd join", level: cfg.Log.Level})
	}
	if f.timeout < 0 {
		return cli.Usagef(env, "bcd join: --timeout must not be negative")
	}
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}

	if f.reset {
		cands := identity.ResetCandidates(cfg.DataDir)
		if !f.yes {
			fmt.Fprintln(env.Stderr, "bcd join: --reset would move aside:")
			for _, c := range cands {
				fmt.Fprintln(env.Stderr, "  "+c)
			}
			return cli.Usagef(env, "bcd join: add --yes to confirm --reset")
		}
		if os.Geteuid() != 0 && !buildinfo.FakeHW {
			return cli.Fail(env, "bcd join", errors.New("--reset runs as root"))
		}
		moved, err := identity.Reset(cfg.DataDir, time.Now())
		if err != nil {
			return cli.Fail(env, "bcd join", err)
		}
		for _, m := range moved {
			log.Info("moved aside for --reset", "path", m)
		}
	}

	if a, err := identity.Load(cfg.DataDir); err == nil {
		if f.nodeID != "" && a.NodeID != f.nodeID {
			return cli.Fail(env, "bcd join", fmt.Errorf("this machine already joined as %s, not --node-id %s (bcd join --reset --yes to join again)", a.NodeID, f.nodeID))
		}
		if err := handOver(cfg); err != nil {
			return cli.Fail(env, "bcd join", err)
		}
		removeTokenFile(f.tokenFile, log.Warn)
		fmt.Fprintf(env.Stdout, "already joined as %s (site %s, role %s)\n", a.NodeID, a.Site, a.Role)
		return 0
	} else if !errors.Is(err, identity.ErrNotJoined) {
		return cli.Fail(env, "bcd join", err)
	}

	var jt join.TPM // the tpm attestor: the host's TPM, and no token
	if f.attestor == "tpm" {
		t, err := OpenTPM(env.Getenv)
		if err != nil {
			return cli.Fail(env, "bcd join", fmt.Errorf("--attestor tpm: %w", err))
		}
		defer t.Close()
		jt = t
	}
	var iid *bcdv1.CloudIdentity // the cloud-iid attestor: EC2's signed identity, and no token
	if f.attestor == cloudiid.Attestor {
		// Off EC2 nothing is asked of 169.254.169.254, which could be
		// anyone's there.
		if err := cloudiid.OnEC2(sysfsRoot(env)); err != nil {
			return cli.Fail(env, "bcd join", fmt.Errorf("--attestor cloud-iid: %w", err))
		}
		ev, err := cloudiid.Fetch(ctx, cloudiid.IMDS)
		if err != nil {
			return cli.Fail(env, "bcd join", fmt.Errorf("--attestor cloud-iid: %w", err))
		}
		iid = &bcdv1.CloudIdentity{Document: ev.Document, Signature: ev.Signature}
	}
	token, code := "", 0
	if jt == nil && iid == nil {
		token, code = readToken(env, envToken, f.tokenFile)
	}
	if code != 0 {
		return code
	}
	if jwk == nil && jt == nil && iid == nil {
		if jwk, code = loadJWK(ctx, env, cfg, &f, doc); code != 0 {
			return code
		}
	}
	client, hc, err := joinClient(cfg)
	if err != nil {
		return cli.Fail(env, "bcd join", err)
	}
	defer hc.CloseIdleConnections()
	a, err := join.Join(ctx, join.Options{
		Client: client, Role: f.role, Attestor: f.attestor, Token: token, EncryptionJWK: jwk, SigningPin: cfg.JoinSigningKeyPin, CloudIID: iid,
		Claims: hostinfo.Claims(cfg.DataDir), DataDir: cfg.DataDir, Log: log, TPM: jt, NodeID: f.nodeID,
		Verified: rootRecord(cfg),
	})
	token = ""
	if err != nil && f.timeout > 0 && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("not joined within --timeout %s (the lines above say why each attempt failed)", f.timeout)
	}
	if err != nil {
		return cli.Fail(env, "bcd join", err)
	}
	if bootstrapped {
		if err := config.WriteFile(cfg.Path, cfg); err != nil {
			return cli.Fail(env, "bcd join", err)
		}
	}
	if doc != nil {
		pub, err := jwk.MarshalJSON()
		if err == nil {
			err = identity.WriteFileAtomic(cfg.JoinEncryptionJWKPath(), append(pub, '\n'), 0o644)
		}
		if err != nil {
			return cli.Fail(env, "bcd join", err)
		}
	}
	if err := handOver(cfg); err != nil {
		return cli.Fail(env, "bcd join", err)
	}
	removeTokenFile(f.tokenFile, log.Warn)
	fmt.Fprintf(env.Stdout, "joined as %s (site %s, role %s); certificate valid until %s\n",
		a.NodeID, a.Site, a.Role, a.Cert.NotAfter.UTC().Format(time.RFC3339))
	return 0
}

// loadOrBootstrap loads config.toml, or builds one from the well-known
// document when it does not exist and --server is given.
func loadOrBootstrap(ctx context.Context, env *cli.Env, f *joinFlags) (*config.Config, *wellknown.Document, *jose.JSONWebKey, bool, int) {
	cfg, err := config.Load(f.config)
	if err == nil {
		for _, c := range []struct{ flag, key, have, want string }{
			{"--serving-ca-pin", "serving_ca_spki_pin", cfg.ServingCASPKIPin, f.servingPin},
			{"--join-signing-pin", "join_signing_key_pin", cfg.JoinSigningKeyPin, f.signingPin},
			{"--join-encryption-pin", "join_encryption_key_pin", cfg.JoinEncryptionKeyPin, f.encPin},
		} {
			if c.want != "" && c.want != c.have {
				return nil, nil, nil, false, cli.Fail(env, "bcd join", fmt.Errorf("%s differs from %s in %s", c.flag, c.key, cfg.Path))
			}
		}
		return cfg, nil, nil, false, 0
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", err)
	}
	if f.server == "" {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", fmt.Errorf("%s does not exist: give --server https://... with --serving-ca-pin, --join-signing-pin and --join-encryption-pin to write it", f.config))
	}
	if f.servingPin == "" || f.signingPin == "" || f.encPin == "" {
		return nil, nil, nil, false, cli.Usagef(env, "bcd join: --server without a config.toml needs --serving-ca-pin, --join-signing-pin and --join-encryption-pin")
	}
	doc, jwk, err := wellknown.Fetch(ctx, f.server, f.servingPin)
	if err != nil {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", fmt.Errorf("--server: %w (check --serving-ca-pin)", err))
	}
	if doc.Pins.JoinSigning != f.signingPin {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", errors.New("the well-known document's join signing key does not match --join-signing-pin"))
	}
	if doc.Pins.JoinEncryption != f.encPin {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", errors.New("the well-known document's join encryption key does not match --join-encryption-pin"))
	}
	if doc.Pins.ServingCA != f.servingPin {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", errors.New("the well-known document's serving CA does not match --serving-ca-pin"))
	}
	abs, err := filepath.Abs(f.config)
	if err != nil {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", err)
	}
	cfg, err = config.Parse(nil, abs)
	if err != nil {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", err)
	}
	cfg.Gateway, cfg.GatewayServerName = doc.Gateway.URL, doc.Gateway.ServerName
	cfg.ServingCASPKIPin, cfg.JoinSigningKeyPin, cfg.JoinEncryptionKeyPin = f.servingPin, f.signingPin, f.encPin
	cfg.DataDir = f.dataDir
	if err := cfg.Validate(); err != nil {
		return nil, nil, nil, false, cli.Fail(env, "bcd join", err)
	}
	return cfg, doc, jwk, true, 0
}

// loadJWK reads join-encryption.jwk next to the config, or the well-known
// document's key with --server, and checks it against its pin.
func loadJWK(ctx context.Context, env *cli.Env, cfg *config.Config, f *joinFlags, doc *wellknown.Document) (*jose.JSONWebKey, int) {
	p := cfg.JoinEncryptionJWKPath()
	b, err := os.ReadFile(p)
	var jwk *jose.JSONWebKey
	switch {
	case err == nil:
		if jwk, err = pki.ParsePublicJWK(b); err != nil {
			return nil, cli.Fail(env, "bcd join", fmt.Errorf("%s: %w", p, err))
		}
	case errors.Is(err, fs.ErrNotExist) && f.server != "":
		if _, jwk, err = wellknown.Fetch(ctx, f.server, cfg.ServingCASPKIPin); err != nil {
			return nil, cli.Fail(env, "bcd join", fmt.Errorf("--server: %w", err))
		}
	default:
		return nil, cli.Fail(env, "bcd join", fmt.Errorf("%s: %w (or give --server to read the key from the well-known document)", p, err))
	}
	if err := pki.MatchPin(cfg.JoinEncryptionKeyPin, mustPublic(jwk)); err != nil {
		return nil, cli.Fail(env, "bcd join", fmt.Errorf("%s does not match join_encryption_key_pin", p))
	}
	return jwk, 0
}

func mustPublic(k *jose.JSONWebKey) any { return k.Key }

// readToken takes the token from BCD_JOIN_TOKEN, else --token-file, else
// the first line of stdin.
func readToken(env *cli.Env, envToken, file string) (string, int) {
	if t := strings.TrimSpace(envToken); t != "" {
		return t, 0
	}
	if file != "" {
		st, err := os.Lstat(file)
		if err != nil {
			return "", cli.Fail(env, "bcd join", fmt.Errorf("--token-file: %w", err))
		}
		if !st.Mode().IsRegular() {
			return "", cli.Fail(env, "bcd join", errors.New("--token-file must be a regular file"))
		}
		if st.Mode().Perm()&0o077 != 0 {
			return "", cli.Fail(env, "bcd join", fmt.Errorf("--token-file is mode %04o; others may read it (chmod 0600)", st.Mode().Perm()))
		}
		if st.Size() > MaxTokenSize {
			return "", cli.Fail(env, "bcd join", errors.New("--token-file is larger than 4 KiB"))
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", cli.Fail(env, "bcd join", fmt.Errorf("--token-file: %w", err))
		}
		if t := firstLine(b); t != "" {
			return t, 0
		}
		return "", cli.Usagef(env, "bcd join: --token-file holds no token")
	}
	if env.Stdin != nil {
		b, _ := io.ReadAll(io.LimitReader(bufio.NewReader(env.Stdin), MaxTokenSize+1))
		if len(b) > MaxTokenSize {
			if i := bytes.IndexByte(b, '\n'); i < 0 || i > MaxTokenSize {
				return "", cli.Usagef(env, "bcd join: the token on stdin is longer than 4 KiB")
			}
		}
		if t := firstLine(b); t != "" {
			return t, 0
		}
	}
	return "", cli.Usagef(env, "bcd join: no join token: set BCD_JOIN_TOKEN, pipe it on stdin or give --token-file")
}

func firstLine(b []byte) string {
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return strings.TrimSpace(string(b))
}

func removeTokenFile(file string, warn func(string, ...any)) {
	if file == "" {
		return
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		warn("could not remove the token file", "path", file, "err", err)
	}
}

// rootRecord keeps the verified JoinResponse in root's directory ([helper]
// state_dir) when bcd join runs as root on a host where bcd node runs
// unprivileged: bcd helper binds signed intent to the node it names
// (docs/helper.md, "Signed sections").
func rootRecord(cfg *config.Config) func(rootsig.JoinRecord) error {
	if cfg.Helper.User == "" || os.Geteuid() != 0 {
		return nil
	}
	return func(rec rootsig.JoinRecord) error {
		return anchor.WriteRecord(cfg.Helper.StateDirOrDefault(), rec)
	}
}

// handOver gives the data directory and the identity to the [helper] user
// when bcd join runs as root on a host where bcd node runs unprivileged, so
// the node can read what root wrote.
func handOver(cfg *config.Config) error {
	if cfg.Helper.User == "" || os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(cfg.Helper.User)
	if err != nil {
		return fmt.Errorf("helper.user: %w", err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("helper.user %s: uid %q gid %q are not numbers", u.Username, u.Uid, u.Gid)
	}
	for _, p := range []string{cfg.DataDir, filepath.Join(cfg.DataDir, identity.IdentityFile), filepath.Join(cfg.DataDir, identity.KeyFile)} {
		if err := os.Lchown(p, uid, gid); err != nil {
			return fmt.Errorf("hand %s to %s: %w", p, u.Username, err)
		}
	}
	if buildinfo.FakeHW {
		// The fake machine's boot id, which the join's claims made (0700
		// root's): bcd node reads it at start.
		fake := filepath.Join(cfg.DataDir, "fakehw")
		for _, p := range []string{fake, filepath.Join(fake, "boot_id")} {
			if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("hand %s to %s: %w", p, u.Username, err)
			}
		}
	}
	return nil
}

// joinClient is the gateway's client for a join: over the WebSocket
// fallback's host with [websocket] url (the answer is signed by the
// pinned join-signing key, so a proxy in the middle cannot forge it),
// else the gateway's own.
func joinClient(cfg *config.Config) (bcdv1connect.AgentGatewayClient, *http.Client, error) {
	if cfg.WebSocket.URL != "" {
		ws, err := transport.NewWS(transport.WSOptions{URL: cfg.WebSocket.URL, CAFile: cfg.WebSocket.CAFile, SigningPin: cfg.JoinSigningKeyPin})
		if err != nil {
			return nil, nil, err
		}
		return ws.Gateway(nil), ws.HTTPClient(), nil
	}
	return transport.Client(transport.Options{URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin})
}

// sysfsRoot is where bcd join reads the DMI: /sys, or in a fakehw build
// BCD_FAKEHW_SYSFS (a fake sysfs tree of a test).
func sysfsRoot(env *cli.Env) string {
	if v := env.Getenv("BCD_FAKEHW_SYSFS"); v != "" && buildinfo.FakeHW {
		return v
	}
	return "/sys"
}
