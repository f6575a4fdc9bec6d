package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/components/agent"
	"github.com/better-compute/bcd/components/agent/hostinfo"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/agent/transport"
	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/base/logging"
	"github.com/better-compute/bcd/components/trust/identity"
	"github.com/better-compute/bcd/components/trust/join"
)

// MaxConcurrentJoins bounds the joins bcd sim runs at once.
const MaxConcurrentJoins = 16

// MaxStarting bounds the machines of one bcd sim process that are started
// and not yet welcomed by the gateway; a machine not welcomed within
// StartWait stops counting (it goes on redialing on its own).
const (
	MaxStarting = 64
	StartWait   = 30 * time.Second
)

// Sim returns `bcd sim` (fakehw builds): --nodes real node agents in one
// process, each a fake machine with its own data directory, identity and
// journal under data_dir/sim/<i>.
func Sim(machine func(dataDir string, seed int64) Machine) cli.Command {
	return cli.Command{Name: "sim", Summary: "run many fake node agents in one process (fakehw)", Run: func(ctx context.Context, env *cli.Env, args []string) int {
		envToken := env.Getenv("BCD_JOIN_TOKEN")
		_ = env.Unsetenv("BCD_JOIN_TOKEN")
		fs := cli.NewFlagSet(env, "bcd", "sim")
		path := fs.String("config", config.DefaultPath, "gateway URL, pins and logging; machines live under data_dir/sim/")
		nodes := fs.Int("nodes", 1, "how many machines")
		seed := fs.Int64("seed", 1, "the fakehw seed of machine 0; machine i uses seed+i")
		perProcess := fs.Int("per-process", 0, "machines one process runs; more are run by child processes (0: as many as the open-file limit allows)")
		shard := fs.String("shard", "", "run only machines FIRST:COUNT, all joined (set by bcd sim for its child processes)")
		if code, ok := cli.Parse(fs, env, args, tokenHint); !ok {
			return code
		}
		if !buildinfo.FakeHW {
			return cli.Usagef(env, "bcd sim: needs a fakehw build (go build -tags fakehw)")
		}
		if *nodes < 1 {
			return cli.Usagef(env, "bcd sim: --nodes must be at least 1")
		}
		cfg, err := config.Load(*path)
		if err != nil {
			return cli.Fail(env, "bcd sim", err)
		}
		log, err := logging.New(env.Stderr, cfg.Log.Level, cfg.Log.Format, "")
		if err != nil {
			return cli.Fail(env, "bcd sim", err)
		}
		first, count := 0, *nodes
		if *shard != "" {
			if first, count, err = parseShard(*shard, *nodes); err != nil {
				return cli.Usagef(env, "bcd sim: --shard: %v", err)
			}
		}
		if *perProcess < 0 {
			return cli.Usagef(env, "bcd sim: --per-process must be at least 0")
		}
		limit := raiseNoFile()
		dirs := make([]string, count)
		var missing []int
		for i := range dirs {
			dirs[i] = filepath.Join(cfg.DataDir, "sim", strconv.Itoa(first+i))
			if _, err := identity.Load(dirs[i]); errors.Is(err, identity.ErrNotJoined) {
				missing = append(missing, i)
			} else if err != nil {
				return cli.Fail(env, "bcd sim", fmt.Errorf("machine %d: %w", i, err))
			}
		}
		if *shard != "" && len(missing) > 0 {
			return cli.Fail(env, "bcd sim", fmt.Errorf("machine %d is not joined (a shard runs joined machines only)", first+missing[0]))
		}
		joined := 0
		if len(missing) > 0 {
			token, code := readToken(env, envToken, "")
			if code != 0 {
				return code
			}
			jwk, code := loadJWK(ctx, env, cfg, &joinFlags{}, nil)
			if code != 0 {
				return code
			}
			client, hc, err := transport.Client(transport.Options{URL: cfg.Gateway, ServerName: cfg.GatewayServerName, ServingCASPKIPin: cfg.ServingCASPKIPin})
			if err != nil {
				return cli.Fail(env, "bcd sim", err)
			}
			start := time.Now()
			var n atomic.Int32
			var firstErr error
			var mu sync.Mutex
			sem := make(chan struct{}, MaxConcurrentJoins)
			var wg sync.WaitGroup
			for _, i := range missing {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					claims := hostinfo.Claims(dirs[i])
					claims.Hostname = fmt.Sprintf("sim-%d", *seed+int64(i))
					_, err := join.Join(ctx, join.Options{Client: client, Role: "node", Token: token, EncryptionJWK: jwk,
						SigningPin: cfg.JoinSigningKeyPin, Claims: claims, DataDir: dirs[i], Log: log.With("machine", i)})
					if err != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = fmt.Errorf("machine %d: %w", i, err)
						}
						mu.Unlock()
						return
					}
					n.Add(1)
				}()
			}
			wg.Wait()
			hc.CloseIdleConnections()
			token = ""
			joined = int(n.Load())
			fmt.Fprintf(env.Stdout, "bcd sim: joined %d machines in %s\n", joined, time.Since(start).Round(time.Millisecond))
			if firstErr != nil {
				return cli.Fail(env, "bcd sim", firstErr)
			}
		}
		per := *perProcess
		if per == 0 {
			per = PerProcess(limit)
		}
		if *shard == "" && *nodes > per {
			reboots, err := runShards(ctx, env, *path, *nodes, *seed, per, log)
			fmt.Fprintf(env.Stdout, "bcd sim: %d machines, %d joined this run, %d reboots\n", *nodes, joined, reboots)
			if err != nil {
				return cli.Fail(env, "bcd sim", err)
			}
			return 0
		}
		var reboots atomic.Int32
		var wg sync.WaitGroup
		errc := make(chan error, len(dirs))
		// At most MaxStarting machines are between their start and their
		// first Welcome at once (or StartWait each): a real fleet's
		// machines each have their own CPU for their start and handshake,
		// these share one process, and all of them dialing at once only
		// times out their handshakes.
		starting := make(chan struct{}, MaxStarting)
		for i, dir := range dirs {
			select {
			case starting <- struct{}{}:
			case <-ctx.Done():
			}
			if ctx.Err() != nil {
				break
			}
			var startOnce sync.Once
			started := func() { startOnce.Do(func() { <-starting }) }
			time.AfterFunc(StartWait, started)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer started()
				mc := *cfg
				mc.DataDir = dir
				mc.SocketPath = filepath.Join(dir, "bcd.sock")
				var m Machine
				if machine != nil {
					m = machine(dir, *seed+int64(first+i))
				}
				for {
					err := agent.Run(ctx, agent.Config{Config: &mc, Role: "node", Kinds: m.Kinds, StatusGPUs: m.StatusGPUs, Version: buildinfo.Version,
						Sections: m.Sections, Machine: m.Report, Watch: m.Watch, ReportSections: m.ReportSections,
						Log: log.With("machine", first+i), FakeReboot: true, Welcomed: func(context.Context) { started() }})
					if errors.Is(err, agent.ErrRebooted) {
						reboots.Add(1)
						continue
					}
					if err != nil && !errors.Is(err, session.ErrRevoked) {
						errc <- fmt.Errorf("machine %d: %w", first+i, err)
					}
					return
				}
			}()
		}
		log.Info("bcd sim running", "machines", len(dirs), "first", first, "seed", *seed, "joined", joined, "open_file_limit", limit)
		wg.Wait()
		close(errc)
		fmt.Fprintf(env.Stdout, "bcd sim: %d machines, %d joined this run, %d reboots\n", len(dirs), joined, reboots.Load())
		for err := range errc {
			return cli.Fail(env, "bcd sim", err)
		}
		return 0
	}}
}
