package helper

import (
	"strings"
	"testing"
)

// rendered is a ruleset of the shape bcd renders for its instances.
const rendered = `#!/usr/sbin/nft -f
# bcd instances
table bridge bcd_instances
delete table bridge bcd_instances
table bridge bcd_instances {
	set guarded_macs { type ether_addr; elements = { 52:54:00:00:00:01 } }
	chain forward {
		type filter hook forward priority 0; policy accept;
		iifname "bcdtap0-0" ether saddr != 52:54:00:00:00:01 drop comment "only the NIC's own MAC {"
		iifname { "bcdtap0-0", "bcdtap1-0" } udp sport 67 drop
	}
}
table inet bcd_taps
flush table inet bcd_taps
table inet bcd_taps { chain input { type filter hook input priority 0; policy accept; } }
table arp bcd_taps {
	chain input { type filter hook input priority 0; policy accept; }
}
`

func TestCheckRulesetAccepts(t *testing.T) {
	for name, text := range map[string]string{
		"rendered":             rendered,
		"one line":             "table inet bcd_taps { chain c { type filter hook input priority 0; } }",
		"semicolons":           "table arp bcd_taps; delete table arp bcd_taps; table arp bcd_taps { }",
		"comments only":        "# nothing\n\n",
		"declaration only":     "table bridge bcd_instances\n",
		"crlf":                 "table inet bcd_taps {\r\n}\r\n",
		"string with keywords": "table inet bcd_taps {\n chain c { counter comment \"include define ruleset table\" }\n}\n",
	} {
		if err := CheckRuleset(text); err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
}

func TestCheckRulesetRefuses(t *testing.T) {
	tests := []struct {
		name, text, wantErr string
	}{
		{"a fourth table", rendered + "table ip filter {\n}\n", `table "ip filter" is not one of bcd's tables`},
		{"bcd name in another family", "table ip bcd_taps { }", `table "ip bcd_taps" is not one of bcd's tables`},
		{"family left out", "table bcd_taps { }", "only table, delete table and flush table"},
		{"include", "include \"/etc/nftables.conf\"\n" + rendered, `"include" is not allowed`},
		{"include inside a block", "table inet bcd_taps {\n include \"/etc/x\"\n}", `"include" is not allowed`},
		{"define", "define x = 1\ntable inet bcd_taps { }", `"define" is not allowed`},
		{"flush ruleset", "flush ruleset", `"ruleset" is not allowed`},
		{"list ruleset in a block", "table inet bcd_taps { list ruleset }", `"ruleset" is not allowed`},
		{"nested table", "table inet bcd_taps { table ip filter { } }", "a table inside a table block"},
		{"delete another table", "delete table ip filter", `table "ip filter"`},
		{"add rule at the top", "add rule inet bcd_taps input drop", "only table, delete table and flush table"},
		{"add table", "add table inet bcd_taps", "only table, delete table and flush table"},
		{"delete table with a block", "delete table inet bcd_taps { }", "only table, delete table and flush table"},
		{"quoted table name", `table inet "bcd_taps" { }`, "a quoted string at the top level"},
		{"unbalanced open", "table inet bcd_taps {\n chain c {\n}", "unbalanced braces"},
		{"unbalanced close", "table inet bcd_taps { }\n}", "unbalanced }"},
		{"brace alone", "{ }", "a { without a table"},
		{"unterminated string", "table inet bcd_taps { chain c { comment \"x } }", "a string that does not end"},
		{"backslash", "table inet \\\nbcd_taps { }", "a backslash outside a string"},
		{"control character", "table inet bcd_taps { \x00 }", "control or non-ASCII"},
		{"non-ASCII word", "table inet bcd_täps { }", "control or non-ASCII"},
		{"upper-case INCLUDE", "INCLUDE \"/x\"", `"INCLUDE" is not allowed`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckRuleset(tt.text)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestCountRules(t *testing.T) {
	out := `{"nftables": [{"metainfo": {"version": "1.0.9"}}, {"table": {"family": "inet", "name": "bcd_taps"}},
{"chain": {"name": "input"}}, {"rule": {"chain": "input"}}, {"rule": {"chain": "input"}}, {"set": {"name": "s"}}]}`
	n, err := countRules([]byte(out))
	if err != nil || n != 2 {
		t.Fatalf("countRules = %d, %v; want 2", n, err)
	}
	if _, err := countRules([]byte("table inet bcd_taps {")); err == nil {
		t.Fatal("countRules of text succeeded")
	}
}

// FuzzFirewallShape: the check never panics, and a ruleset it accepts
// names, outside strings and comments, no include, define or ruleset, no
// table but bcd's three at the top level, and balanced braces.
func FuzzFirewallShape(f *testing.F) {
	for _, s := range []string{rendered, "table ip filter { }", "include \"x\"", "table inet bcd_taps { \"}\" }", "flush ruleset", "table arp bcd_taps;{"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if CheckRuleset(text) != nil {
			return
		}
		toks, err := nftTokens(text)
		if err != nil {
			t.Fatalf("accepted a ruleset that does not tokenize: %v", err)
		}
		depth := 0
		var top []string
		for _, tok := range toks {
			switch tok.kind {
			case tokOpen:
				depth++
			case tokClose:
				depth--
			case tokWord:
				w := strings.ToLower(tok.text)
				if w == "include" || w == "define" || w == "ruleset" {
					t.Fatalf("accepted %q", tok.text)
				}
				if depth == 0 {
					top = append(top, tok.text)
				} else if w == "table" {
					t.Fatal("accepted a nested table")
				}
			}
			if depth < 0 {
				t.Fatal("accepted unbalanced braces")
			}
		}
		if depth != 0 {
			t.Fatal("accepted unbalanced braces")
		}
		for i, w := range top {
			if w == "table" {
				if i+2 >= len(top) {
					t.Fatalf("accepted a table without a family and name: %q", text)
				}
				name := top[i+1] + " " + top[i+2]
				if name != "bridge bcd_instances" && name != "inet bcd_taps" && name != "arp bcd_taps" {
					t.Fatalf("accepted table %q", name)
				}
			}
		}
	})
}
