// Command binsize prints a Go binary's size and the packages that take the
// most of it: the sizes of its code and data symbols (go tool nm -size),
// summed by package. make sizes runs it on the node and site binaries; it
// is how the helper was brought under its budget (docs/decisions.md).
//
//	binsize [-top 10] [-json] BINARY[=SHIPPED]...
//
// BINARY must not be stripped (the symbol table is what it reads); the
// size printed is SHIPPED's when given (the same build stripped, as it is
// shipped). Symbol sizes leave out the tables that grow with them
// (pclntab, DWARF).
package main

import (
	"debug/elf"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

// Pkg is one package's share of a binary.
type Pkg struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// Report is one binary.
type Report struct {
	Binary  string `json:"binary"`
	Bytes   int64  `json:"bytes"`
	Symbols int64  `json:"symbol_bytes"`
	Top     []Pkg  `json:"top"`
}

func main() {
	top := flag.Int("top", 10, "how many packages to list")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: binsize [-top N] [-json] BINARY...")
		os.Exit(2)
	}
	var out []Report
	for _, arg := range flag.Args() {
		bin, shipped, _ := strings.Cut(arg, "=")
		r, err := measure(bin, shipped, *top)
		if err != nil {
			fmt.Fprintf(os.Stderr, "binsize: %s: %v\n", bin, err)
			os.Exit(1)
		}
		out = append(out, r)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return
	}
	for _, r := range out {
		fmt.Printf("%-28s %10d bytes (%.2f MiB); its largest packages (code and data symbols):\n", r.Binary, r.Bytes, float64(r.Bytes)/(1<<20))
		for i, p := range r.Top {
			fmt.Printf("  %2d. %-60s %9d bytes\n", i+1, p.Path, p.Bytes)
		}
	}
}

func measure(bin, shipped string, top int) (Report, error) {
	if shipped == "" {
		shipped = bin
	}
	st, err := os.Stat(shipped)
	if err != nil {
		return Report{}, err
	}
	f, err := elf.Open(bin)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		return Report{}, fmt.Errorf("symbols: %w (a stripped binary has none: build it without -s)", err)
	}
	by := map[string]int64{}
	var total int64
	for _, s := range syms {
		i := int(s.Section)
		if i <= 0 || i >= len(f.Sections) || f.Sections[i].Type == elf.SHT_NOBITS {
			continue // bss takes no room in the file
		}
		total += int64(s.Size)
		by[pkgOf(s.Name)] += int64(s.Size)
	}
	r := Report{Binary: shipped, Bytes: st.Size(), Symbols: total}
	for p, n := range by {
		r.Top = append(r.Top, Pkg{p, n})
	}
	sort.Slice(r.Top, func(a, b int) bool {
		if r.Top[a].Bytes != r.Top[b].Bytes {
			return r.Top[a].Bytes > r.Top[b].Bytes
		}
		return r.Top[a].Path < r.Top[b].Path
	})
	if len(r.Top) > top {
		r.Top = r.Top[:top]
	}
	return r, nil
}

// pkgOf is the package a symbol belongs to: "a/b/c.(*T).M" is a/b/c;
// "type:*a/b.T" is a/b; symbols of the runtime's own tables (go:, type:
// without a package, runtime.*) keep their prefix.
func pkgOf(sym string) string {
	for _, pre := range []string{"type:.eq.", "type:", "go:itab.", "go:struct", "*", "[...]"} {
		sym = strings.TrimPrefix(sym, pre)
	}
	if strings.HasPrefix(sym, "go:") {
		return "go: (runtime tables)"
	}
	sym = strings.TrimLeft(sym, "(*[]")
	slash := strings.LastIndex(sym, "/")
	if slash < 0 {
		slash = 0
	}
	if dot := strings.IndexAny(sym[slash:], ".,"); dot >= 0 {
		return sym[:slash+dot]
	}
	return sym
}
