// Package netguard is the node's side of the instances' network policy:
// it has bcd helper load the policy from the signed instances section
// before any domain with a tap starts, keeps which instance holds which
// address under the loaded tables, and checks every 5 seconds that the
// tables still hold the rules loaded. When a table or chain was flushed,
// it stops trusting addresses at once, has the helper load the policy
// again and trusts them again only once it has. The metadata service and
// instance tunnels ask Owner who holds an address. docs/instances.md,
// "Network policy", describes it.
package netguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/agent/status"
	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// Interval is how often the tables are checked.
const Interval = 5 * time.Second

// Helper is what the guard needs of bcd helper (helperclient.Client).
type Helper interface {
	ApplyNetPolicy(ctx context.Context, section []byte, proof rootsig.Proof) (rules int64, failed map[string]string, err error)
	CheckFirewall(ctx context.Context, rules int64) (loaded bool, err error)
}

// The states of a tap in Taps.
const (
	// Guarded: its rules are loaded.
	Guarded = "GUARDED"
	// Failed: its instance's policy could not be expressed; it passes
	// nothing.
	Failed = "FAILED"
	// Unloaded: the tables are not loaded (flushed, or nft could not load
	// them); the metadata service trusts none of its addresses.
	Unloaded = "UNLOADED"
)

// TapState is one tap as bcd status shows it (agent.Config.StatusTaps
// takes Taps as it is).
type TapState = status.Tap

// Guard holds the policy last loaded.
type Guard struct {
	helper Helper
	log    *slog.Logger

	// run serializes Apply and Check; mu guards the state below and is
	// never held across a call to the helper, so Owner answers (no)
	// while the policy loads.
	run     sync.Mutex
	mu      sync.Mutex
	section []byte
	proof   rootsig.Proof
	have    bool // a section was applied
	rules   int64
	loaded  bool
	failed  map[string]string
	owners  map[netip.Addr]string // guarded address -> instance
	taps    []TapState
}

// New returns a guard over helper.
func New(helper Helper, log *slog.Logger) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{helper: helper, log: log}
}

// Apply has the helper load the policy of section (the instances section
// of the held spec, with its proof) and returns the instances whose
// policy could not be expressed, with why: they must not run. An error
// means nothing was loaded: no instance with a NIC may start.
func (g *Guard) Apply(ctx context.Context, section []byte, proof rootsig.Proof) (map[string]string, error) {
	g.run.Lock()
	defer g.run.Unlock()
	g.mu.Lock()
	g.section, g.proof, g.have = section, proof, true
	g.mu.Unlock()
	return g.apply(ctx)
}

// apply loads the held section, with run held.
func (g *Guard) apply(ctx context.Context) (map[string]string, error) {
	g.mu.Lock()
	g.loaded = false
	section, proof := g.section, g.proof
	g.mu.Unlock()
	instances, err := netpolicy.Decode(section)
	if err != nil {
		return nil, err
	}
	rules, failed, err := g.helper.ApplyNetPolicy(ctx, section, proof)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.setTaps(instances, nil, err)
		return nil, fmt.Errorf("loading the instances' network policy: %w", err)
	}
	g.rules, g.failed, g.loaded = rules, failed, true
	g.owners = map[netip.Addr]string{}
	running := runningIDs(section)
	for _, in := range instances {
		if _, bad := failed[in.ID]; bad || !running[in.ID] {
			continue
		}
		for _, n := range in.NICs {
			for _, a := range n.Addresses {
				if p, err := netpolicy.ParseAddress(a); err == nil {
					g.owners[p.Addr()] = in.ID
				}
			}
		}
	}
	g.setTaps(instances, failed, nil)
	return failed, nil
}

// runningIDs are the instances the section wants RUNNING: only their
// addresses are trusted.
func runningIDs(section []byte) map[string]bool {
	var s struct {
		Instances []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"instances"`
	}
	out := map[string]bool{}
	if json.Unmarshal(section, &s) == nil {
		for _, in := range s.Instances {
			out[in.ID] = in.State == "RUNNING"
		}
	}
	return out
}

func (g *Guard) setTaps(instances []netpolicy.Instance, failed map[string]string, loadErr error) {
	g.taps = nil
	for _, in := range instances {
		for i, n := range in.NICs {
			st := TapState{Tap: netpolicy.TapName(in.ID, i), Instance: in.ID, Policy: n.Policy, State: Guarded}
			switch why, bad := failed[in.ID]; {
			case loadErr != nil:
				st.State, st.Reason = Unloaded, loadErr.Error()
			case bad:
				st.State, st.Reason = Failed, why
			}
			g.taps = append(g.taps, st)
		}
	}
}

// Check asks the helper whether the tables still hold the rules loaded;
// if not, it stops trusting addresses and loads the policy again at once.
// It reports whether the tables are loaded when it returns.
func (g *Guard) Check(ctx context.Context) (bool, error) {
	g.run.Lock()
	defer g.run.Unlock()
	g.mu.Lock()
	have, loaded, rules := g.have, g.loaded, g.rules
	g.mu.Unlock()
	if !have {
		return false, nil
	}
	if loaded {
		ok, err := g.helper.CheckFirewall(ctx, rules)
		if ok && err == nil {
			return true, nil
		}
		why := errors.New("the tables were flushed or changed")
		if err != nil {
			// The helper could not tell: trust nothing until it can.
			why = fmt.Errorf("checking bcd's tables: %w", err)
		}
		g.mu.Lock()
		g.loaded = false
		g.markUnloaded(why)
		g.mu.Unlock()
		if err != nil {
			return false, why
		}
		g.log.Warn("netguard: bcd's nftables tables were changed; loading them again", "rules", rules)
	}
	if _, err := g.apply(ctx); err != nil {
		return false, err
	}
	g.log.Info("netguard: the instances' network policy is loaded again")
	return true, nil
}

func (g *Guard) markUnloaded(why error) {
	for i := range g.taps {
		if g.taps[i].State == Guarded {
			g.taps[i].State, g.taps[i].Reason = Unloaded, why.Error()
		}
	}
}

// Run checks every interval until ctx ends.
func (g *Guard) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := g.Check(ctx); err != nil {
				g.log.Warn("netguard: the instances' network policy is not loaded", "error", err)
			}
		}
	}
}

// Owner is the running instance that holds address a under the loaded
// tables. While the tables are not loaded it trusts no address.
func (g *Guard) Owner(a netip.Addr) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.loaded {
		return "", false
	}
	id, ok := g.owners[a.Unmap()]
	return id, ok
}

// Loaded reports whether the tables were loaded at the last apply or
// check.
func (g *Guard) Loaded() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.loaded
}

// Taps is every NIC's tap with its policy and state, for bcd status.
func (g *Guard) Taps() []TapState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.taps)
}

// Addresses are the addresses of running instance id under the loaded
// tables, IPv4 first (instance tunnels dial the first). While the tables
// are not loaded it trusts none.
func (g *Guard) Addresses(id string) []netip.Addr {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.loaded {
		return nil
	}
	var out []netip.Addr
	for a, owner := range g.owners {
		if owner == id {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int {
		if a.Is4() != b.Is4() {
			if a.Is4() {
				return -1
			}
			return 1
		}
		return a.Compare(b)
	})
	return out
}
