// Package kmod loads Linux kernel modules in dependency order from a
// modules tree (/lib/modules/<release>), the way modprobe would but with
// no tools in the image: it reads modules.dep, modules.softdep,
// modules.alias and modules.builtin, orders the closure of the asked
// modules (hard dependencies and pre softdeps before a module, post
// softdeps after it; a cycle is refused), and loads each with
// finit_module, or init_module for a .ko.gz or .ko.zst it decompressed
// in Go. EEXIST means the module was already loaded.
//
// The ordering (Index, Resolve) is pure and portable, so the ramdisk
// builder uses it to copy exactly the modules the image needs; Loader has
// its two syscalls behind fields for tests.
package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Module is one loadable module of a plan.
type Module struct {
	Name string // canonical name: '-' written as '_' (nvme_core)
	Path string // as modules.dep names it, relative to the release directory
	// Deps are the hard dependencies modules.dep lists, by canonical name.
	Deps []string
	// Soft is set when only softdeps lead to this module: loading it is
	// best effort and its failure fails nothing else.
	Soft bool
}

// Plan is the ordered closure of the asked modules.
type Plan struct {
	Modules []Module // load order: every module after its dependencies
	Builtin []string // asked names the kernel has built in: nothing to load
	// Missing are softdep targets no modules.dep, modules.builtin or
	// modules.alias entry provides; modprobe would also skip them.
	Missing []string
}

// Names returns the plan's module names in load order.
func (p Plan) Names() []string {
	out := make([]string, len(p.Modules))
	for i, m := range p.Modules {
		out[i] = m.Name
	}
	return out
}

// Index is what a modules tree says about its modules.
type Index struct {
	Dir     string              // the release directory it was read from
	paths   map[string]string   // name -> relative path
	deps    map[string][]string // name -> hard dependency names, modules.dep order
	pre     map[string][]string // softdep pre: names (or aliases)
	post    map[string][]string // softdep post: names (or aliases)
	aliases map[string][]string // exact alias -> module names
	globs   []glob              // device aliases (patterns), modules.alias order
	builtin map[string]bool
}

// glob is a device alias: a modalias pattern (pci:v00008086d*...) and
// the module that drives what it matches.
type glob struct{ pattern, module string }

// Canonical is a module name as the kernel knows it: the file name without
// .ko and compression suffix, '-' written as '_'.
func Canonical(s string) string {
	s = path.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// ReadIndex reads dir/modules.dep (required) and, when present,
// modules.softdep, modules.alias and modules.builtin.
func ReadIndex(dir string) (*Index, error) {
	ix := &Index{
		Dir:     dir,
		paths:   map[string]string{},
		deps:    map[string][]string{},
		pre:     map[string][]string{},
		post:    map[string][]string{},
		aliases: map[string][]string{},
		builtin: map[string]bool{},
	}
	files := []struct {
		name     string
		required bool
		parse    func(io.Reader) error
	}{
		{"modules.dep", true, ix.parseDep},
		{"modules.softdep", false, ix.parseSoftdep},
		{"modules.alias", false, ix.parseAlias},
		{"modules.builtin", false, ix.parseBuiltin},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		fh, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) && !f.required {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kmod: %w", err)
		}
		err = f.parse(fh)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("kmod: %s: %w", p, err)
		}
	}
	// Every dependency must itself be listed: a modules.dep that names a
	// file it does not describe is corrupt, and guessing would load
	// modules out of order.
	for name, ds := range ix.deps {
		for _, d := range ds {
			if _, ok := ix.paths[d]; !ok {
				return nil, fmt.Errorf("kmod: %s/modules.dep: %s depends on %s, which has no line of its own", dir, name, d)
			}
		}
	}
	return ix, nil
}

func lines(r io.Reader, fn func(n int, line string) error) error {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for s.Scan() {
		n++
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	return s.Err()
}

// parseDep reads "path: dep-path dep-path ..." lines.
func (ix *Index) parseDep(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		p, rest, ok := strings.Cut(line, ":")
		p = strings.TrimSpace(p)
		if !ok || p == "" || !strings.Contains(path.Base(p), ".ko") {
			return fmt.Errorf("line %d: not \"module.ko: deps\"", n)
		}
		name := Canonical(p)
		if other, dup := ix.paths[name]; dup {
			return fmt.Errorf("line %d: module %s listed twice (%s and %s)", n, name, other, p)
		}
		ix.paths[name] = p
		var deps []string
		for _, d := range strings.Fields(rest) {
			deps = append(deps, Canonical(d))
		}
		ix.deps[name] = deps
		return nil
	})
}

// parseSoftdep reads "softdep mod pre: a b post: c" lines.
func (ix *Index) parseSoftdep(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "softdep" {
			return fmt.Errorf("line %d: not \"softdep module pre: ... post: ...\"", n)
		}
		name := Canonical(f[1])
		var into *map[string][]string
		for _, w := range f[2:] {
			switch w {
			case "pre:":
				into = &ix.pre
			case "post:":
				into = &ix.post
			default:
				// Like modprobe, ignore names before pre: or post:
				// (Debian 6.1 has "softdep cifs gcm").
				if into != nil {
					(*into)[name] = append((*into)[name], canonicalAlias(w))
				}
			}
		}
		return nil
	})
}

// parseAlias reads "alias pattern module" lines: exact (glob-free)
// aliases, which softdeps name (crct10dif, crypto-...), and device
// aliases (pci:v...*), which Match tries against a device's modalias.
func (ix *Index) parseAlias(r io.Reader) error {
	return lines(r, func(n int, line string) error {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "alias" {
			return fmt.Errorf("line %d: not \"alias pattern module\"", n)
		}
		if strings.ContainsAny(f[1], "*?[") {
			ix.globs = append(ix.globs, glob{pattern: f[1], module: Canonical(f[2])})
			return nil
		}
		a := canonicalAlias(f[1])
		m := Canonical(f[2])
		if !slices.Contains(ix.aliases[a], m) {
			ix.aliases[a] = append(ix.aliases[a], m)
		}
		return nil
	})
}

// parseBuiltin reads one built-in module path per line.
func (ix *Index) parseBuiltin(r io.Reader) error {
	return lines(r, func(_ int, line string) error {
		ix.builtin[Canonical(line)] = true
		return nil
	})
}

// canonicalAlias writes '-' as '_' like module names, so "crc64-rocksoft"
// and "crc64_rocksoft" meet.
func canonicalAlias(s string) string { return strings.ReplaceAll(s, "-", "_") }

// Match returns the modules whose device aliases match modalias (a
// device's /sys/.../modalias, e.g. pci:v00008086d000010D3sv...), sorted.
// Patterns are fnmatch globs; a malformed one matches nothing.
func (ix *Index) Match(modalias string) []string {
	var out []string
	for _, g := range ix.globs {
		if ok, err := path.Match(g.pattern, modalias); ok && err == nil && !slices.Contains(out, g.module) {
			out = append(out, g.module)
		}
	}
	slices.Sort(out)
	return out
}

// Path returns the relative path of a module, if the index has it.
func (ix *Index) Path(name string) (string, bool) {
	p, ok := ix.paths[Canonical(name)]
	return p, ok
}

// Builtin reports whether the kernel has the module built in.
func (ix *Index) Builtin(name string) bool { return ix.builtin[Canonical(name)] }

// lookup returns the modules a name stands for: itself, or what an exact
// alias names.
func (ix *Index) lookup(name string) (mods []string, builtin bool) {
	n := Canonical(name)
	if _, ok := ix.paths[n]; ok {
		return []string{n}, false
	}
	if ix.builtin[n] {
		return nil, true
	}
	a := canonicalAlias(name)
	for _, m := range ix.aliases[a] {
		if _, ok := ix.paths[m]; ok {
			mods = append(mods, m)
		} else if ix.builtin[m] {
			builtin = true
		}
	}
	return mods, builtin && len(mods) == 0
}

// Resolve orders the closure of names: hard dependencies (modules.dep) and
// pre softdeps before each module, post softdeps after it. A name is a
// module (dashes or underscores) or an exact alias. A name nothing
// provides is an error; a softdep target nothing provides is listed in
// Missing. A cycle is an error naming it.
func (ix *Index) Resolve(names ...string) (Plan, error) {
	r := resolver{ix: ix, state: map[string]int{}, at: map[string]int{}}
	for _, name := range names {
		mods, builtin := ix.lookup(name)
		if builtin {
			if !slices.Contains(r.plan.Builtin, Canonical(name)) {
				r.plan.Builtin = append(r.plan.Builtin, Canonical(name))
			}
			continue
		}
		if len(mods) == 0 {
			return Plan{}, fmt.Errorf("kmod: module %s: not in %s/modules.dep, modules.builtin or modules.alias", name, ix.Dir)
		}
		for _, m := range mods {
			if err := r.visit(m, false); err != nil {
				return Plan{}, err
			}
		}
	}
	return r.plan, nil
}

type resolver struct {
	ix    *Index
	plan  Plan
	state map[string]int // 0 new, 1 on the stack, 2 placed
	at    map[string]int // index in plan.Modules
	stack []string
}

func (r *resolver) visit(name string, soft bool) error {
	switch r.state[name] {
	case 2:
		if !soft {
			r.harden(name)
		}
		return nil
	case 1:
		i := slices.Index(r.stack, name)
		cycle := append(slices.Clone(r.stack[i:]), name)
		return fmt.Errorf("kmod: dependency cycle: %s", strings.Join(cycle, " -> "))
	}
	r.state[name] = 1
	r.stack = append(r.stack, name)
	if err := r.softdeps(r.ix.pre[name]); err != nil {
		return err
	}
	// modprobe loads the last listed dependency first; the depth-first
	// walk orders each dependency's own dependencies before it anyway.
	deps := r.ix.deps[name]
	for i := len(deps) - 1; i >= 0; i-- {
		if err := r.visit(deps[i], soft); err != nil {
			return err
		}
	}
	r.stack = r.stack[:len(r.stack)-1]
	r.state[name] = 2
	r.at[name] = len(r.plan.Modules)
	r.plan.Modules = append(r.plan.Modules, Module{
		Name: name, Path: r.ix.paths[name], Deps: slices.Clone(deps), Soft: soft,
	})
	return r.softdeps(r.ix.post[name])
}

func (r *resolver) softdeps(names []string) error {
	for _, s := range names {
		mods, builtin := r.ix.lookup(s)
		if builtin {
			continue
		}
		if len(mods) == 0 {
			if !slices.Contains(r.plan.Missing, s) {
				r.plan.Missing = append(r.plan.Missing, s)
			}
			continue
		}
		for _, m := range mods {
			if err := r.visit(m, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// harden marks a module reached softly first and now needed for real, and
// its dependencies with it.
func (r *resolver) harden(name string) {
	m := &r.plan.Modules[r.at[name]]
	if !m.Soft {
		return
	}
	m.Soft = false
	for _, d := range m.Deps {
		r.harden(d)
	}
}

// WriteSubset writes the index files of a tree holding only plan's
// modules into dir (modules.dep, modules.softdep and modules.alias lines
// that concern them), so the tree in an image resolves the same plan.
func (ix *Index) WriteSubset(dir string, plan Plan) error {
	in := map[string]bool{}
	for _, m := range plan.Modules {
		in[m.Name] = true
	}
	var dep, soft, alias strings.Builder
	for _, m := range plan.Modules {
		fmt.Fprintf(&dep, "%s:", m.Path)
		for _, d := range m.Deps {
			fmt.Fprintf(&dep, " %s", ix.paths[d])
		}
		dep.WriteString("\n")
		pre, post := ix.pre[m.Name], ix.post[m.Name]
		if len(pre)+len(post) > 0 {
			fmt.Fprintf(&soft, "softdep %s", m.Name)
			if len(pre) > 0 {
				fmt.Fprintf(&soft, " pre: %s", strings.Join(pre, " "))
			}
			if len(post) > 0 {
				fmt.Fprintf(&soft, " post: %s", strings.Join(post, " "))
			}
			soft.WriteString("\n")
		}
	}
	as := make([]string, 0, len(ix.aliases))
	for a := range ix.aliases {
		as = append(as, a)
	}
	slices.Sort(as)
	for _, a := range as {
		for _, m := range ix.aliases[a] {
			if in[m] {
				fmt.Fprintf(&alias, "alias %s %s\n", a, m)
			}
		}
	}
	for _, g := range ix.globs {
		if in[g.module] {
			fmt.Fprintf(&alias, "alias %s %s\n", g.pattern, g.module)
		}
	}
	var builtin strings.Builder
	bs := make([]string, 0, len(plan.Builtin))
	bs = append(bs, plan.Builtin...)
	slices.Sort(bs)
	for _, b := range bs {
		fmt.Fprintf(&builtin, "%s.ko\n", b)
	}
	for name, content := range map[string]string{
		"modules.dep": dep.String(), "modules.softdep": soft.String(),
		"modules.alias": alias.String(), "modules.builtin": builtin.String(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("kmod: %w", err)
		}
	}
	return nil
}
