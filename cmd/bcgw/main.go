// Command bcgw is the lab gateway and minimal control plane that bcd
// agents dial: `bcgw serve` runs it; the other commands talk to a running
// one over its admin API.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/logging"
	"github.com/better-compute/bcd/components/gateway"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/trust/cloudiid"
	"github.com/better-compute/bcd/components/trust/intent"
	"github.com/better-compute/bcd/components/trust/wellknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := program().Main(ctx, cli.StdEnv(), os.Args[1:])
	stop()
	os.Exit(code)
}

// program is bcgw's command table.
func program() *cli.Program {
	p := &cli.Program{
		Name: "bcgw",
		Commands: []cli.Command{
			{Name: "serve", Summary: "run the gateway and control plane", Run: serve},
			{Name: "token", Summary: "token create | ls | rm ID: make, list or delete join tokens", Run: token},
			{Name: "node", Summary: "node rm NODE: revoke a node and forget it (its commands, spec, report, events)", Run: nodeCmd},
			{Name: "nodes", Summary: "list nodes", Run: nodes},
			{Name: "admin-token", Summary: "admin-token create NAME | ls | rm NAME: named admin tokens for the loopback admin listener", Run: adminTokenCmd},
			{Name: "backup", Summary: "backup --out FILE: a consistent copy of a bbolt gateway's store, taken while it serves", Run: backup},
			{Name: "serving-cert", Summary: "serving-cert renew: a new serving certificate under the serving CA, from the next TLS handshake on (also done by itself after 20 of its 30 days)", Run: servingCert},
			{Name: "audit", Summary: "audit [--json] [--after SEQ] [--limit N]: who changed what through the admin API", Run: audit},
			{Name: "page", Summary: "page [--json] [--html FILE]: a one-time link to the fleet page on the loopback admin listener", Run: page},
			{Name: "health", Summary: "health [--json]: this gateway's sessions and whether its database answers (exit 1 when it does not)", Run: health},
			{Name: "tpm", Summary: "tpm enroll: let a TPM join (bcd join --attestor tpm) by its EK or EK CA", Run: tpmCmd},
			{Name: "run", Summary: "run NODE KIND: send a command and print its result (--prepare: print it to sign; --submit FILE: send a prepared one)", Run: run},
			{Name: "sign", Summary: "sign --key KEY.pem [--file FILE]: sign a prepared command or spec (no gateway needed)", Run: signCmd},
			{Name: "trust", Summary: "trust show|add-root|remove-root|rotate-key|approvers: the trust bundle's command-signing roots and approver set, bcgw's own key", Run: trustCmd},
			{Name: "batch", Summary: "batch create|approve|submit: destructive commands as a batch the approvers approve", Run: batchCmd},
			{Name: "revoke", Summary: "revoke NODE: revoke a node's certificate", Run: revoke},
			{Name: "cancel", Summary: "cancel COMMAND: cancel a command", Run: cancel},
			{Name: "discovered", Summary: "discovered SITE [--json]: the machines that asked the site to boot and that nobody prepared", Run: discovered},
			{Name: "status", Summary: "status NODE [--json]: the node's connection, spec generations, sections and latest status report", Run: nodeStatus},
			{Name: "spec", Summary: "spec set|patch|get|prepare|submit: a node's desired spec", Run: specCmd},
			{Name: "instance", Summary: "instance add|state|remove NODE --id ID ...: one instance of the node's instances section, as a new spec generation", Run: instanceCmd},
			{Name: "snapshot", Summary: "snapshot NODE INSTANCE --to URL [--memory]: instance.snapshot to a presigned https URL, waiting for its result (the archive's bytes and SHA-256)", Run: snapshotCmd},
			{Name: "instances", Summary: "instances NODE [--json]: the domains the node's runtime lists and why instances failed, from its latest report", Run: instancesCmd},
			{Name: "hold", Summary: "hold NODE --alloc ID --gpu N|UUID|MIG-UUID|N/slotS ...: add a GPU hold to the node's devices section", Run: hold},
			{Name: "ssh-ca", Summary: "ssh-ca [NODE ...] [--account A ...] [--revoke SERIAL ...]: the SSH user CA, put into the nodes' access sections", Run: sshCA},
			{Name: "ssh-sign", Summary: "ssh-sign --principal NODE:ACCOUNT --pubkey FILE: a short-lived SSH user certificate", Run: sshSign},
			{Name: "tunnel", Summary: "tunnel NODE|--instance ID --ssh|--tcp PORT: stdin and stdout to the node's (or an instance's) sshd or port (an ssh ProxyCommand)", Run: tunnelCmd},
			{Name: "console", Summary: "console NODE --account A | [NODE] --instance ID: an interactive login shell on the node, or an instance's serial console", Run: console},
			{Name: "release", Summary: "release NODE --alloc ID: remove a GPU hold; release publish FILE --artifact PATH...: store a signed bcd release and serve its binaries; release list: the published releases and their expiry", Run: releaseCmd},
			{Name: "upgrade", Summary: "upgrade NODE|--all --version V [--wait]: daemon.upgrade to a published release", Run: upgrade},
			{Name: "events", Summary: "events NODE [--follow] [--json]: the node's stored events", Run: events},
			{Name: "cache-images", Summary: "cache-images SITE --image SHA256=URL ...: what a site keeps in its image cache", Run: cacheImages},
			{Name: "bmc-credentials", Summary: "store a BMC's login (the password from stdin)", Run: bmcCredentials},
			{Name: "secret", Summary: "secret set NAME [--node NODE] --value-file FILE|- | delete NAME [--node NODE] | list: the secrets agents ask for by name (telemetry-header/<Name>, instance-user-data/<allocation>)", Run: secretCmd},
			{Name: "kek", Summary: "kek generate [--out FILE] | kek fingerprint FILE: the key-encryption key a fleet's gateways seal their keys in the database under", Run: kekCmd},
			{Name: "well-known", Summary: "print the well-known document (--pins: the bcd join flags)", Run: wellKnown},
		},
		Version: cli.VersionInfo{Version: buildinfo.Version, Commit: buildinfo.Commit, Tags: buildinfo.Tags()},
	}
	for i, c := range p.Commands {
		if groups[c.Name] {
			p.Commands[i].Run = groupHelp(c.Run)
		}
	}
	return p
}

// groups are the commands whose first argument is a verb (or, for
// release, a node or a verb): with no argument they print their usage
// and exit 2.
var groups = map[string]bool{"token": true, "node": true, "admin-token": true, "tpm": true, "trust": true, "batch": true,
	"spec": true, "instance": true, "release": true, "secret": true, "kek": true, "serving-cert": true}

// groupHelp answers a group's -h (or --help) alone with its usage on
// stdout and exit 0, as every command's -h.
func groupHelp(run func(context.Context, *cli.Env, []string) int) func(context.Context, *cli.Env, []string) int {
	return func(ctx context.Context, env *cli.Env, args []string) int {
		if len(args) != 1 || (args[0] != "-h" && args[0] != "--help" && args[0] != "-help") {
			return run(ctx, env, args)
		}
		var buf strings.Builder
		quiet := *env
		quiet.Stdout, quiet.Stderr = &buf, &buf
		run(ctx, &quiet, nil)
		fmt.Fprint(env.Stdout, buf.String())
		return 0
	}
}

func defaultDataDir() string {
	if d := os.Getenv("BCGW_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/bcgw"
}

// adminFlags are the flags of every command that talks to a running bcgw.
type adminFlags struct {
	dataDir, url, tokenFile string
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.dataDir, "data-dir", defaultDataDir(), "the data directory of the bcgw to talk to (its admin.sock); env BCGW_DATA_DIR")
	fs.StringVar(&a.url, "admin", "", "a loopback admin URL instead of the socket (with --admin-token-file)")
	fs.StringVar(&a.tokenFile, "admin-token-file", "", "file holding the admin bearer token (DATA/admin.token)")
}

func (a *adminFlags) client() (*adminapi.Client, error) {
	var bearer string
	if a.url != "" {
		b, err := os.ReadFile(a.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-token-file: %w", err)
		}
		bearer = strings.TrimSpace(string(b))
	}
	return adminapi.NewClient(a.dataDir, a.url, bearer), nil
}

// parseInterleaved parses flags that may follow positional arguments;
// there must be npos of them (any number when npos is negative).
func parseInterleaved(fs *flag.FlagSet, env *cli.Env, args []string, npos int, usage string) ([]string, int, bool) {
	var pos []string
	for {
		out := fs.Output()
		fs.SetOutput(io.Discard)
		err := fs.Parse(args)
		fs.SetOutput(out)
		if err != nil {
			if err == flag.ErrHelp {
				printUsage(env, fs, usage)
				return nil, 0, false
			}
			return nil, cli.Usagef(env, "usage: %s", usage), false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	if npos >= 0 && len(pos) != npos {
		return nil, cli.Usagef(env, "usage: %s", usage), false
	}
	return pos, 0, true
}

// printUsage is -h of a command with positionals, in the style cli.Parse
// prints for the others: the usage line, then the flags, on stdout.
func printUsage(env *cli.Env, fs *flag.FlagSet, usage string) {
	fmt.Fprintf(env.Stdout, "usage: %s\n\nflags:\n", usage)
	out := fs.Output()
	fs.SetOutput(env.Stdout)
	fs.PrintDefaults()
	fs.SetOutput(out)
}

func serve(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "serve")
	var cfg gateway.Config
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "where all state lives (made on first start)")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8443", "address of the gateway (AgentGateway and well-known)")
	fs.StringVar(&cfg.URL, "url", "", "gateway URL published to agents (default https://LISTEN)")
	fs.StringVar(&cfg.ServerName, "server-name", "bcgw.lab", "TLS server name of the gateway certificate")
	fs.StringVar(&cfg.Name, "name", "", "this gateway's name among several on one database, shown where a node's session is (default HOSTNAME:DATA-DIR)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", "", "also serve the admin API on this loopback address (bearer token in DATA/admin.token)")
	fs.StringVar(&cfg.MetricsListen, "metrics", "", "serve bcgw's own metrics (Prometheus text) at /metrics on this address; a bare PORT is on loopback")
	fs.BoolVar(&cfg.Profile, "profile", false, "with --metrics: also serve Go's profiles and execution trace at /debug/pprof/ there, recording blocking and lock contention (a little slower)")
	fs.StringVar(&cfg.HealthListen, "health", "", "also answer the balancer's health check (GET /readyz, plain HTTP) on this HOST:PORT, where it never waits behind agents' TLS handshakes")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", 0, "refuse sessions beyond this many with a retry pushback (0: no limit)")
	fs.DurationVar(&cfg.Pushback, "pushback", 2*time.Second, "the pushback a busy refusal carries")
	fs.Float64Var(&cfg.JoinRate, "join-rate", agentsvc.DefaultJoinRate, "joins a second admitted; past it a join is refused with a retry pushback (-1: no limit)")
	fs.DurationVar(&cfg.CertValidity, "cert-validity", 24*time.Hour, "lifetime of node certificates")
	fs.DurationVar(&cfg.Heartbeat, "heartbeat", 15*time.Second, "heartbeat interval asked of agents")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", 45*time.Second, "a site's boot lease lapses this long after its holder's last heartbeat")
	database := fs.String("database", "", "keep the store in PostgreSQL at this URL (no password in it: see --database-file); default the bbolt file DATA/bcgw.db")
	databaseFile := fs.String("database-file", "", "a file holding the PostgreSQL URL of the store (it may carry a password)")
	fs.StringVar(&cfg.CommandKey, "command-key", "", "bcgw's own command-signing key: a PEM file, or none (sign nothing); default DATA/command-signing.key, made at first start")
	kekFlag := fs.String("key-encryption-key", "", "with --database: the key-encryption key's file (bcgw kek generate), the same for every gateway; the keys are stored in the database sealed under it (default: the systemd credential "+kekCredential+")")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	iidCerts := fs.String("cloud-iid-certs", "", "a PEM file of the certificates EC2 identity documents must verify under (AWS's published RSA certificates of the regions that may join); unset, cloud-iid joins are refused")
	fs.DurationVar(&cfg.CloudIIDMaxAge, "cloud-iid-max-age", agentsvc.DefaultCloudIIDMaxAge, "how long after launch an EC2 instance may join with cloud-iid (-1ns: no limit)")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	if err := checkServe(cfg); err != nil {
		return cli.Usagef(env, "bcgw serve: %v", err)
	}
	if *iidCerts != "" {
		b, err := os.ReadFile(*iidCerts)
		if err == nil {
			cfg.CloudIIDCerts, err = cloudiid.ParseCerts(b)
		}
		if err != nil {
			return cli.Usagef(env, "bcgw serve: --cloud-iid-certs: %v", err)
		}
	}
	log, err := logging.New(env.Stderr, *level, "json", "bcgw")
	if err != nil {
		return cli.Usagef(env, "bcgw serve: %v", err)
	}
	cfg.Log = log
	if cfg.Database, err = databaseURL(*database, *databaseFile); err != nil {
		return cli.Usagef(env, "bcgw serve: %v", err)
	}
	if cfg.KEKFile, err = kekFile(*kekFlag, env.Getenv); err != nil {
		return cli.Usagef(env, "bcgw serve: %v", err)
	}
	s, err := gateway.NewContext(ctx, cfg)
	if err != nil {
		return cli.Fail(env, "bcgw serve", err)
	}
	if err := s.Run(ctx); err != nil {
		return cli.Fail(env, "bcgw serve", err)
	}
	return 0
}

func token(ctx context.Context, env *cli.Env, args []string) int {
	if len(args) > 0 && (args[0] == "ls" || args[0] == "rm") {
		return tokenLsRm(ctx, env, args)
	}
	if len(args) == 0 || args[0] != "create" {
		return cli.Usagef(env, "usage: bcgw token create [--uses N] [--role node|site] [--site S] [--ttl D] [--node-id ID | --cloud-iid-account ACCOUNT [--region R]] | ls [--json] | rm ID")
	}
	fs := cli.NewFlagSet(env, "bcgw", "token create")
	var a adminFlags
	a.register(fs)
	uses := fs.Int("uses", 1, "how many joins the token admits")
	role := fs.String("role", "node", "node or site")
	site := fs.String("site", "lab", "the site joined agents belong to")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid (0: no expiry)")
	nodeID := fs.String("node-id", "", "a provisioned token: the installed OS joins as this node (bcd join --node-id); one use")
	account := fs.String("cloud-iid-account", "", "a cloud-iid rule, not a token: EC2 instances of this AWS account join with bcd join --attestor cloud-iid, up to --uses of them; prints the rule's id")
	region := fs.String("region", "", "with --cloud-iid-account: only instances of this region")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := cli.Parse(fs, env, args[1:], ""); !ok {
		return code
	}
	if *region != "" && *account == "" {
		return cli.Usagef(env, "bcgw token create: --region needs --cloud-iid-account")
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw token create", err)
	}
	t, err := c.CreateToken(ctx, adminapi.TokenRequest{Role: *role, Site: *site, Uses: *uses, TTLSeconds: int(ttl.Seconds()), NodeID: *nodeID,
		CloudAccount: *account, CloudRegion: *region})
	if err != nil {
		return cli.Fail(env, "bcgw token create", err)
	}
	if *asJSON {
		return printJSON(env, t)
	}
	if *account != "" {
		fmt.Fprintf(env.Stdout, "cloud-iid rule %s: EC2 instances of account %s may join (bcd join --attestor cloud-iid)\n", t.ID, *account)
		return 0
	}
	fmt.Fprintln(env.Stdout, t.Token)
	return 0
}

func printJSON(env *cli.Env, v any) int {
	enc := json.NewEncoder(env.Stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return cli.Fail(env, "bcgw", err)
	}
	return 0
}

// fetchView runs the start of a command that reads one view and takes no
// arguments: its admin flags and --json, then the one admin call. ok is
// false when the command is over, with its exit code (usage, or the call
// failed).
func fetchView[T any](ctx context.Context, env *cli.Env, args []string, name string,
	get func(*adminapi.Client, context.Context) (T, error)) (v T, asJSON bool, code int, ok bool) {
	fs := cli.NewFlagSet(env, "bcgw", name)
	var a adminFlags
	a.register(fs)
	j := fs.Bool("json", false, "print JSON")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return v, false, code, false
	}
	c, err := a.client()
	if err == nil {
		v, err = get(c, ctx)
	}
	if err != nil {
		return v, false, cli.Fail(env, "bcgw "+name, err), false
	}
	return v, *j, 0, true
}

func nodes(ctx context.Context, env *cli.Env, args []string) int {
	ns, asJSON, code, ok := fetchView(ctx, env, args, "nodes", (*adminapi.Client).Nodes)
	if !ok {
		return code
	}
	if asJSON {
		return printJSON(env, ns)
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tSITE\tCONNECTED\tEPOCH\tREVOKED\tHOSTNAME\tAK\tGATEWAY")
	for _, n := range ns {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%v\t%s\t%s\t%s\n", n.ID, n.Role, n.Site, n.Connected, n.Epoch, n.Revoked, n.Hostname, orDash(n.AK), orDash(n.Gateway))
	}
	tw.Flush()
	return 0
}

// checkDeadline refuses a command deadline further out than
// intent.MaxDeadline: an agent keeps a command's id until its deadline
// has passed, and refuses a signed command due later (docs/delivery.md).
func checkDeadline(d time.Duration) error {
	if d > intent.MaxDeadline {
		return fmt.Errorf("%s is more than %s ahead: agents refuse a signed command due later (they remember every command they ran until its deadline); prepare it again with a shorter --deadline",
			d.Round(time.Second), intent.MaxDeadline)
	}
	return nil
}

const runUsage = "bcgw run NODE KIND [--body JSON] [--deadline D] [--wait] [--prepare] | bcgw run --submit FILE [--wait]"

func run(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "run")
	var a adminFlags
	a.register(fs)
	body := fs.String("body", "", "the command body (JSON)")
	wait := fs.Bool("wait", false, "wait for the result and print it")
	timeout := fs.Duration("timeout", 5*time.Minute, "with --wait, how long to wait")
	deadline := fs.Duration("deadline", 10*time.Minute, "the command's deadline")
	userData := fs.String("user-data", "", "deploy.image: a file of user data (cloud-init NoCloud or Ignition), sent as a secret bound to the command, never in its body")
	var secretHeaders stringsFlag
	fs.Var(&secretHeaders, "secret-header", "site.httpProxy: NAME=FILE, a header whose value is read from FILE and sent as a secret bound to the command, never in its body or argv; repeat for each (name it in the body's secret_headers)")
	prepare := fs.Bool("prepare", false, "print the command as JSON, to sign with bcgw sign; nothing is stored or sent")
	submit := fs.String("submit", "", "send this prepared command (bcgw run --prepare, signed or not) as it is")
	pos, code, ok := parseInterleaved(fs, env, args, -1, runUsage)
	if !ok {
		return code
	}
	switch {
	case *submit != "" && (len(pos) != 0 || *prepare || *body != ""):
		return cli.Usagef(env, "bcgw run: --submit takes no NODE, KIND, --body or --prepare: the file holds the command\nusage: %s", runUsage)
	case *submit == "" && len(pos) != 2:
		return cli.Usagef(env, "usage: %s", runUsage)
	case *prepare && (*wait || *userData != "" || len(secretHeaders) > 0):
		return cli.Usagef(env, "bcgw run: --prepare sends nothing, so no --wait; give --user-data to bcgw run --submit\nusage: %s", runUsage)
	}
	if *body != "" && !json.Valid([]byte(*body)) {
		return cli.Usagef(env, "bcgw run: --body is not JSON")
	}
	if err := checkDeadline(*deadline); err != nil {
		return cli.Usagef(env, "bcgw run: --deadline %v", err)
	}
	var ud []byte
	if *userData != "" {
		var err error
		if ud, err = readSmallFile(*userData, fleet.MaxUserData); err != nil {
			return cli.Usagef(env, "bcgw run: --user-data: %v", err)
		}
	}
	headers := map[string]string{}
	for _, sh := range secretHeaders {
		name, file, ok := strings.Cut(sh, "=")
		if !ok || name == "" || file == "" {
			return cli.Usagef(env, "bcgw run: --secret-header takes NAME=FILE (the value is read from FILE)")
		}
		b, err := readSmallFile(file, 8192)
		if err != nil {
			return cli.Usagef(env, "bcgw run: --secret-header %s: %v", name, err)
		}
		headers[name] = strings.TrimRight(string(b), "\r\n")
	}
	if len(headers) == 0 {
		headers = nil
	}
	var prepared *adminapi.PreparedCommand
	if *submit != "" {
		b, err := readSmallFile(*submit, 16<<20)
		if err != nil {
			return cli.Fail(env, "bcgw run --submit", err)
		}
		c, _, err := adminapi.DecodePrepared(b)
		if err == nil && c == nil {
			err = fmt.Errorf("%s is a prepared spec; send it with bcgw spec submit", *submit)
		}
		if err == nil {
			err = checkDeadline(time.Until(time.UnixMilli(c.DeadlineMS)))
		}
		if err != nil {
			return cli.Fail(env, "bcgw run --submit", fmt.Errorf("%s: %w", *submit, err))
		}
		prepared = c
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw run", err)
	}
	var cmd adminapi.CommandView
	switch {
	case *prepare:
		p, err := c.PrepareCommand(ctx, adminapi.CommandRequest{Node: pos[0], Kind: pos[1], Body: json.RawMessage(*body), DeadlineSeconds: int(deadline.Seconds())})
		if err != nil {
			return cli.Fail(env, "bcgw run --prepare", err)
		}
		return printJSON(env, p)
	case prepared != nil:
		if cmd, err = c.SubmitCommand(ctx, adminapi.SubmitCommandRequest{Command: *prepared, UserData: ud, SecretHeaders: headers}); err != nil {
			return cli.Fail(env, "bcgw run --submit", err)
		}
		if cmd.Warning != "" {
			fmt.Fprintf(env.Stderr, "bcgw run: warning: %s\n", cmd.Warning)
		}
	default:
		req := adminapi.CommandRequest{Node: pos[0], Kind: pos[1], Body: json.RawMessage(*body), DeadlineSeconds: int(deadline.Seconds()), UserData: ud, SecretHeaders: headers}
		if cmd, err = c.Send(ctx, req); err != nil {
			return cli.Fail(env, "bcgw run", err)
		}
		if cmd.Warning != "" {
			fmt.Fprintf(env.Stderr, "bcgw run: warning: %s\n", cmd.Warning)
		}
	}
	if !*wait {
		return printJSON(env, cmd)
	}
	return waitResult(ctx, env, c, cmd, *timeout, "bcgw run")
}

// waitResult waits up to timeout for cmd's result, showing its progress
// on stderr as it changes, and prints the command's view: exit 0 when it
// SUCCEEDED.
func waitResult(ctx context.Context, env *cli.Env, c *adminapi.Client, cmd adminapi.CommandView, timeout time.Duration, name string) int {
	var err error
	end := time.Now().Add(timeout)
	lastProgress := ""
	for cmd.State != "done" {
		left := time.Until(end)
		if left <= 0 {
			printJSON(env, cmd)
			return cli.Fail(env, name, fmt.Errorf("no result for %s within %s", cmd.ID, timeout))
		}
		// Short waits, so the command's progress shows while it runs (on
		// stderr: stdout stays the one JSON view).
		if cmd, err = c.Command(ctx, cmd.ID, min(left, 2*time.Second)); err != nil {
			return cli.Fail(env, name, err)
		}
		if p := string(cmd.Progress); p != "" && p != lastProgress {
			lastProgress = p
			fmt.Fprintf(env.Stderr, "%s: %s progress: %s\n", name, cmd.ID, p)
		}
	}
	printJSON(env, cmd)
	if cmd.Status != "SUCCEEDED" {
		return 1
	}
	return 0
}

func revoke(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "revoke")
	var a adminFlags
	a.register(fs)
	asJSON := fs.Bool("json", false, "print {\"revoked\": NODE}")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw revoke NODE [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw revoke", err)
	}
	if err := c.Revoke(ctx, pos[0]); err != nil {
		return cli.Fail(env, "bcgw revoke", err)
	}
	if *asJSON {
		return printJSON(env, map[string]string{"revoked": pos[0]})
	}
	fmt.Fprintf(env.Stdout, "revoked %s\n", pos[0])
	return 0
}

func cancel(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "cancel")
	var a adminFlags
	a.register(fs)
	reason := fs.String("reason", "", "why (reported in the result)")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw cancel COMMAND [--reason TEXT]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw cancel", err)
	}
	v, err := c.Cancel(ctx, pos[0], *reason)
	if err != nil {
		return cli.Fail(env, "bcgw cancel", err)
	}
	return printJSON(env, v)
}

// imageFlags collects repeated --image SHA256=URL.
type imageFlags []adminapi.CacheImage

func (f *imageFlags) String() string { return fmt.Sprint(len(*f)) }

func (f *imageFlags) Set(v string) error {
	sha, u, ok := strings.Cut(v, "=")
	if !ok || len(sha) != 64 || !strings.HasPrefix(u, "https://") {
		return fmt.Errorf("want SHA256=https://URL")
	}
	*f = append(*f, adminapi.CacheImage{SHA256: sha, URL: u})
	return nil
}

func cacheImages(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "cache-images")
	var a adminFlags
	a.register(fs)
	var images imageFlags
	fs.Var(&images, "image", "SHA256=https://URL, repeatable; none clears the list")
	asJSON := fs.Bool("json", false, "print {\"site\", \"images\"}")
	pos, code, ok := parseInterleaved(fs, env, args, 1, "bcgw cache-images SITE [--image SHA256=URL ...] [--json]")
	if !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw cache-images", err)
	}
	if err := c.SetCacheImages(ctx, pos[0], images); err != nil {
		return cli.Fail(env, "bcgw cache-images", err)
	}
	if *asJSON {
		return printJSON(env, map[string]any{"site": pos[0], "images": len(images)})
	}
	fmt.Fprintf(env.Stdout, "%s keeps %d images\n", pos[0], len(images))
	return 0
}

func bmcCredentials(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "bmc-credentials")
	var a adminFlags
	a.register(fs)
	addr := fs.String("address", "", "the BMC's address as bmc.* commands name it (IP[:port])")
	user := fs.String("username", "", "the BMC account")
	legacy := fs.Bool("legacy-tls", false, "allow commands that reach this BMC with TLS 1.2 and RSA key exchange (old BMCs; no forward secrecy; the pin still applies)")
	if code, ok := cli.Parse(fs, env, args, "the password is read from stdin, never from arguments"); !ok {
		return code
	}
	b, _ := io.ReadAll(io.LimitReader(env.Stdin, 4096))
	pw := strings.TrimRight(string(b), "\r\n")
	if *addr == "" || *user == "" || pw == "" {
		return cli.Usagef(env, "usage: bcgw bmc-credentials --address IP --username USER [--legacy-tls] < password-file")
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw bmc-credentials", err)
	}
	if err := c.EnrollBMC(ctx, *addr, *user, pw, *legacy); err != nil {
		return cli.Fail(env, "bcgw bmc-credentials", err)
	}
	fmt.Fprintf(env.Stdout, "stored credentials for BMC %s\n", *addr)
	if *legacy {
		fmt.Fprintf(env.Stdout, "legacy TLS: on (TLS 1.2 with RSA key exchange, no forward secrecy; the SPKI pin still applies; commands must say \"legacy_tls\": true)\n")
	}
	return 0
}

func wellKnown(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "well-known")
	var a adminFlags
	a.register(fs)
	pins := fs.Bool("pins", false, "print the three pin flags of bcd join")
	if code, ok := cli.Parse(fs, env, args, ""); !ok {
		return code
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw well-known", err)
	}
	var d wellknown.Document
	if err := c.WellKnown(ctx, &d); err != nil {
		return cli.Fail(env, "bcgw well-known", err)
	}
	if *pins {
		fmt.Fprintf(env.Stdout, "--serving-ca-pin=%s --join-signing-pin=%s --join-encryption-pin=%s\n", d.Pins.ServingCA, d.Pins.JoinSigning, d.Pins.JoinEncryption)
		return 0
	}
	return printJSON(env, d)
}

// readSmallFile reads a regular file of at most limit bytes.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return b, nil
}
