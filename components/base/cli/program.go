package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
)

// Command is one subcommand of a program.
type Command struct {
	Name    string
	Summary string // one line for the command list
	// Run gets the arguments after the command name and returns the exit code.
	Run func(ctx context.Context, env *Env, args []string) int
}

// Program is a binary's command table.
type Program struct {
	Name     string    // "bcd" or "bcgw"
	Role     string    // "node", "site", "ramdisk", "helper"; "" for bcgw
	Commands []Command // what this build has
	// Documented lists commands the product documents that this build may
	// lack, each with the line printed when it is asked for, e.g.
	// "sim": "bcd sim: needs a fakehw build (go build -tags fakehw)". An
	// empty line prints "bcd NAME: not in this build (ROLE)".
	Documented map[string]string
	Version    VersionInfo
}

// VersionInfo describes the build.
type VersionInfo struct {
	Version string
	Commit  string
	Tags    []string
}

// Main runs the command args[0] names with the rest of args (args excludes
// argv[0]) and returns the process exit code.
func (p *Program) Main(ctx context.Context, env *Env, args []string) int {
	if len(args) == 0 {
		p.usage(env)
		return ExitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if name == "help" && len(rest) > 0 {
			// "help CMD" is "CMD -h".
			return p.Main(ctx, env, []string{rest[0], "-h"})
		}
		p.help(env)
		return ExitOK
	case "--version", "-version":
		name = "version"
	}
	if c := p.lookup(name); c != nil {
		return c.Run(ctx, env, rest)
	}
	if name == "version" {
		return p.version(env, rest)
	}
	if line, ok := p.Documented[name]; ok {
		if line == "" {
			line = p.notInBuild(name)
		}
		fmt.Fprintln(env.Stderr, line)
		return ExitUsage
	}
	if looksLikeCommand(name) {
		fmt.Fprintf(env.Stderr, "%s: unknown command %q\n", p.Name, name)
	} else {
		fmt.Fprintf(env.Stderr, "%s: unknown command\n", p.Name)
	}
	return ExitUsage
}

func (p *Program) lookup(name string) *Command {
	for i := range p.Commands {
		if p.Commands[i].Name == name {
			return &p.Commands[i]
		}
	}
	return nil
}

func (p *Program) notInBuild(name string) string {
	if p.Role == "" {
		return fmt.Sprintf("%s %s: not in this build", p.Name, name)
	}
	return fmt.Sprintf("%s %s: not in this build (%s)", p.Name, name, p.Role)
}

// commands is the command table with the built-in version appended when
// the program does not define its own.
func (p *Program) commands() []Command {
	cs := append([]Command(nil), p.Commands...)
	if p.lookup("version") == nil {
		cs = append(cs, Command{Name: "version", Summary: "print the version, platform, Go version and build tags"})
	}
	return cs
}

func (p *Program) usage(env *Env) {
	fmt.Fprintf(env.Stderr, "usage: %s <command> [flags]\n", p.Name)
	fmt.Fprintf(env.Stderr, "Run '%s help' for the list of commands.\n", p.Name)
}

func (p *Program) help(env *Env) {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s <command> [flags]\n\ncommands:\n", p.Name)
	cs := p.commands()
	width := 0
	for _, c := range cs {
		width = max(width, len(c.Name))
	}
	for _, c := range cs {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, c.Name, c.Summary)
	}
	var missing []string
	for name := range p.Documented {
		if p.lookup(name) == nil && name != "version" { // version is built in
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		fmt.Fprintf(&b, "\nnot in this build: %s\n", strings.Join(missing, ", "))
	}
	fmt.Fprintf(&b, "\nRun '%s <command> -h' for a command's flags.\n", p.Name)
	fmt.Fprint(env.Stdout, b.String())
}

// versionJSON is the output of "version --json".
type versionJSON struct {
	Program string   `json:"program"`
	Version string   `json:"version"`
	Commit  string   `json:"commit,omitempty"`
	Role    string   `json:"role,omitempty"`
	OS      string   `json:"os"`
	Arch    string   `json:"arch"`
	Go      string   `json:"go"`
	Tags    []string `json:"tags"`
}

// version is the built-in version command.
func (p *Program) version(env *Env, args []string) int {
	fs := NewFlagSet(env, p.Name, "version")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if code, ok := Parse(fs, env, args, ""); !ok {
		return code
	}
	v := versionJSON{
		Program: p.Name,
		Version: p.Version.Version,
		Commit:  p.Version.Commit,
		Role:    p.Role,
		OS:      runtime.GOOS,
		Arch:    runtime.GOARCH,
		Go:      runtime.Version(),
		Tags:    append([]string{}, p.Version.Tags...),
	}
	if v.Version == "" {
		v.Version = "unknown"
	}
	if *asJSON {
		out, err := json.Marshal(v)
		if err != nil {
			return Fail(env, p.Name+" version", fmt.Errorf("encoding JSON: %w", err))
		}
		fmt.Fprintf(env.Stdout, "%s\n", out)
		return ExitOK
	}
	line := v.Program + " " + v.Version
	if v.Role != "" {
		line += " (" + v.Role + ")"
	}
	line += " " + v.OS + "/" + v.Arch + " " + v.Go
	if v.Commit != "" {
		line += " commit=" + v.Commit
	}
	if len(v.Tags) > 0 {
		line += " tags=" + strings.Join(v.Tags, ",")
	}
	fmt.Fprintln(env.Stdout, line)
	return ExitOK
}
