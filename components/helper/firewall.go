package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// firewallTables are the only nftables tables a ruleset may name, as
// "family name".
var firewallTables = []string{"bridge bcd_instances", "inet bcd_taps", "arp bcd_taps"}

// forbiddenWords may appear nowhere outside a quoted string or comment:
// include and define would read files or change what the rest means, and
// a line naming ruleset reaches beyond bcd's tables (flush ruleset).
var forbiddenWords = []string{"include", "define", "ruleset"}

// CheckRuleset checks that an nftables ruleset has only the shape bcd
// renders: at the top level, `table F N`, `delete table F N`,
// `flush table F N` and `table F N {` ... `}` blocks, where F N is one of
// bridge bcd_instances, inet bcd_taps and arp bcd_taps (the same name in
// another family is refused); inside a block no `table`; nowhere
// `include`, `define` or `ruleset`; balanced braces, terminated strings,
// no line continuation, no control characters and only ASCII outside
// quoted strings and comments.
func CheckRuleset(text string) error {
	toks, err := nftTokens(text)
	if err != nil {
		return err
	}
	depth := 0
	var stmt []nftToken // the top-level statement being read
	for _, t := range toks {
		if t.kind == tokWord {
			for _, w := range forbiddenWords {
				if strings.EqualFold(t.text, w) {
					return fmt.Errorf("line %d: %q is not allowed in a firewall ruleset", t.line, t.text)
				}
			}
		}
		if depth > 0 {
			switch {
			case t.kind == tokOpen:
				depth++
			case t.kind == tokClose:
				depth--
			case t.kind == tokWord && strings.EqualFold(t.text, "table"):
				return fmt.Errorf("line %d: a table inside a table block", t.line)
			}
			continue
		}
		switch t.kind {
		case tokWord, tokString:
			stmt = append(stmt, t)
		case tokEnd:
			if err := topStatement(stmt, false); err != nil {
				return err
			}
			stmt = stmt[:0]
		case tokOpen:
			if err := topStatement(stmt, true); err != nil {
				return err
			}
			stmt = stmt[:0]
			depth = 1
		case tokClose:
			return fmt.Errorf("line %d: unbalanced }", t.line)
		}
	}
	if depth != 0 {
		return errors.New("unbalanced braces: a block is not closed")
	}
	return topStatement(stmt, false)
}

// topStatement checks one top-level statement; open says it ends with {.
func topStatement(stmt []nftToken, open bool) error {
	if len(stmt) == 0 {
		if open {
			return errors.New("a { without a table")
		}
		return nil
	}
	words := make([]string, len(stmt))
	for i, t := range stmt {
		if t.kind != tokWord {
			return fmt.Errorf("line %d: a quoted string at the top level", t.line)
		}
		words[i] = t.text
	}
	line := stmt[0].line
	var table []string
	switch {
	case len(words) == 3 && words[0] == "table":
		table = words[1:]
	case len(words) == 4 && (words[0] == "delete" || words[0] == "flush") && words[1] == "table" && !open:
		table = words[2:]
	default:
		return fmt.Errorf("line %d: only table, delete table and flush table of bcd's tables are allowed at the top level", line)
	}
	name := table[0] + " " + table[1]
	for _, ok := range firewallTables {
		if name == ok {
			return nil
		}
	}
	return fmt.Errorf("line %d: table %q is not one of bcd's tables (%s)", line, name, strings.Join(firewallTables, ", "))
}

type tokKind int

const (
	tokWord   tokKind = iota
	tokString         // "..."
	tokOpen           // {
	tokClose          // }
	tokEnd            // a newline or ;
)

type nftToken struct {
	kind tokKind
	text string
	line int
}

// nftTokens splits text into words, quoted strings, braces and statement
// ends, dropping comments (# to the end of the line).
func nftTokens(text string) ([]nftToken, error) {
	var out []nftToken
	line := 1
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '\n':
			out = append(out, nftToken{kind: tokEnd, line: line})
			line++
			i++
		case c == ';':
			out = append(out, nftToken{kind: tokEnd, line: line})
			i++
		case c == '{':
			out = append(out, nftToken{kind: tokOpen, line: line})
			i++
		case c == '}':
			out = append(out, nftToken{kind: tokClose, line: line})
			i++
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				if bad(text[i]) {
					return nil, fmt.Errorf("line %d: a control character", line)
				}
				i++
			}
		case c == '"':
			j := i + 1
			for j < len(text) && text[j] != '"' {
				if text[j] == '\n' || bad(text[j]) {
					return nil, fmt.Errorf("line %d: a string that does not end on its line", line)
				}
				j++
			}
			if j == len(text) {
				return nil, fmt.Errorf("line %d: a string that does not end", line)
			}
			out = append(out, nftToken{kind: tokString, text: text[i+1 : j], line: line})
			i = j + 1
		case c == '\\':
			return nil, fmt.Errorf("line %d: a backslash outside a string", line)
		case c < 0x20 || c >= 0x7f:
			return nil, fmt.Errorf("line %d: a control or non-ASCII character outside a string", line)
		default:
			j := i
			for j < len(text) && !strings.ContainsRune(" \t\r\n;{}#\"\\", rune(text[j])) && text[j] >= 0x20 && text[j] < 0x7f {
				j++
			}
			out = append(out, nftToken{kind: tokWord, text: text[i:j], line: line})
			i = j
		}
	}
	return out, nil
}

// bad is a control character other than tab (newlines end comments and
// are refused in strings by the callers).
func bad(c byte) bool { return c < 0x20 && c != '\t' || c == 0x7f }

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
