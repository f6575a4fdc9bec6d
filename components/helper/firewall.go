package helper

import (
	"encoding/json"
	"fmt"
)

// firewallTables are bcd's nftables tables, as "family name": the ones
// firewall.check counts. No operation loads rules into them from the node;
// the instances' network policy has the helper render them itself.
var firewallTables = []string{"bridge bcd_instances", "inet bcd_taps", "arp bcd_taps"}

// countRules counts the rules in `nft -j list table F N` output.
func countRules(out []byte) (int64, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("reading nft -j output: %w", err)
	}
	var n int64
	for _, obj := range doc.Nftables {
		if _, ok := obj["rule"]; ok {
			n++
		}
	}
	return n, nil
}
