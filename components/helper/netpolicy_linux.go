//go:build linux

package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/better-compute/bcd/components/helper/netpolicy"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// netpolicyMu runs one netpolicy.apply at a time: each replaces the whole
// of bcd's tables.
var netpolicyMu sync.Mutex

// loadedPolicy is what the last netpolicy.apply loaded: the taps it
// guards and the rules the tables then held (under netpolicyMu).
var loadedPolicy struct {
	taps  map[string]bool
	rules int64
}

// tapGuarded is LibvirtHost.Guarded: tap is one the last netpolicy.apply
// guards, and bcd's tables still hold the rules it loaded.
func (srv *server) tapGuarded(ctx context.Context, tap string) error {
	netpolicyMu.Lock()
	defer netpolicyMu.Unlock()
	if !loadedPolicy.taps[tap] {
		return fmt.Errorf("tap %s is not guarded by the network policy root loaded (netpolicy.apply first)", tap)
	}
	n, loaded, err := srv.firewallRules(ctx)
	if err != nil {
		return fmt.Errorf("checking bcd's tables: %w", err)
	}
	if !loaded || n != loadedPolicy.rules {
		return fmt.Errorf("bcd's tables do not hold the rules netpolicy.apply loaded (%d now, %d loaded): the node loads them again", n, loadedPolicy.rules)
	}
	return nil
}

// maxFailReason bounds each reason netpolicy.apply answers.
const maxFailReason = 240

// netpolicyApply is netpolicy.apply: the helper takes the instances
// section only from a signed spec (its proof through anchor.Admit under
// root's own anchors, as access.apply), reads the NICs from the section
// itself, the bridges and whether the host is an EC2 instance from the
// host, plans the taps (an instance whose policy cannot be expressed is
// answered as failed and its taps pass nothing), renders bcd's three
// tables and loads them in one nft transaction. No rule text comes from
// the node. It answers the rules the tables then hold, for firewall.check.
func (srv *server) netpolicyApply(ctx context.Context, req *wire.Request) (*wire.Response, string) {
	proof, err := rootsig.DecodeProof(req.Proof)
	if err != nil {
		return refused(fmt.Errorf("netpolicy.apply: %w", err))
	}
	netpolicyMu.Lock()
	defer netpolicyMu.Unlock()
	anchors, err := srv.anchors()
	if err != nil {
		return refused(fmt.Errorf("netpolicy.apply: %w", err))
	}
	commit, err := anchors.Admit(proof, "instances", req.Section)
	if err != nil {
		return refused(fmt.Errorf("netpolicy.apply refused: %w", err))
	}
	instances, err := netpolicy.Decode(req.Section)
	if err != nil {
		return refused(fmt.Errorf("netpolicy.apply: %w", err))
	}
	host, err := srv.s.netHost(netpolicy.BridgeNames(instances))
	if err != nil {
		return failed(fmt.Errorf("netpolicy.apply: %w", err), true)
	}
	taps, _, failedIDs := netpolicy.Plan(instances, host)
	rules, err := netpolicy.Render(taps, host)
	if err != nil {
		return failed(fmt.Errorf("netpolicy.apply: %w", err), false)
	}
	if _, err := srv.s.nft(ctx, rules, "-f", "-"); err != nil {
		return failed(fmt.Errorf("netpolicy.apply: loading the ruleset: %w", err), !errors.Is(err, errNoNft))
	}
	n, loaded, err := srv.firewallRules(ctx)
	if err != nil || !loaded {
		return failed(fmt.Errorf("netpolicy.apply: counting the rules loaded: %v", err), true)
	}
	if err := commit(); err != nil {
		return failed(fmt.Errorf("netpolicy.apply: %w", err), true)
	}
	loadedPolicy.taps, loadedPolicy.rules = map[string]bool{}, n
	for _, t := range taps {
		loadedPolicy.taps[t.Name] = true
	}
	for id, why := range failedIDs {
		if len(why) > maxFailReason {
			failedIDs[id] = wire.CutReason(why[:maxFailReason])
		}
	}
	answer, _ := json.Marshal(struct {
		Failed map[string]string `json:"failed"`
	}{failedIDs})
	srv.log.Info("helper: netpolicy.apply", "taps", len(taps), "failed", len(failedIDs), "rules", n, "ec2", host.EC2, "generation", proof.Generation)
	return &wire.Response{OK: true, Rules: &n, NetPolicy: answer}, "ok"
}
