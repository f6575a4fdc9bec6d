package helperclient

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// ApplyNetPolicy asks the helper to load the instances' network policy
// from the instances section of the held spec with its proof: the helper
// verifies both, reads the NICs itself and renders every rule. It answers
// the rules the tables then hold and the instances whose policy it could
// not express, with why.
func (c *Client) ApplyNetPolicy(ctx context.Context, section []byte, proof rootsig.Proof) (rules int64, failed map[string]string, err error) {
	p, err := json.Marshal(proof)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpNetPolicyApply, Section: section, Proof: p})
	if err != nil {
		return 0, nil, err
	}
	var ans struct {
		Failed map[string]string `json:"failed"`
	}
	if err := json.Unmarshal(resp.NetPolicy, &ans); err != nil {
		return 0, nil, fmt.Errorf("netpolicy.apply's answer: %w", err)
	}
	return *resp.Rules, ans.Failed, nil
}

// CheckFirewall asks the helper whether bcd's tables hold rules rules:
// false when a table or chain was flushed or deleted since.
func (c *Client) CheckFirewall(ctx context.Context, rules int64) (bool, error) {
	resp, err := c.Do(ctx, &wire.Request{V: wire.Version, Op: wire.OpFirewallCheck, Rules: &rules})
	if err != nil {
		return false, err
	}
	return *resp.Loaded, nil
}
