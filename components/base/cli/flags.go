package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// NewFlagSet returns a flag set named "PROG CMD" that returns errors rather
// than exiting and writes to env.Stderr. Its Usage is nil: Parse prints
// "usage: PROG CMD [flags]" and the flags for -h unless the caller sets one.
func NewFlagSet(env *Env, prog, cmd string) *flag.FlagSet {
	fs := flag.NewFlagSet(prog+" "+cmd, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = nil // Parse prints its own help unless the caller sets one
	return fs
}

// Parse parses args into fs and reports whether the command should go on.
// When it should not, code is the exit code to return:
//
//   - -h or -help prints the flags to env.Stdout: (0, false).
//   - An unknown or malformed flag: (2, false). The flag's name is printed
//     only when it looks like a flag name (-name or --name, lower case),
//     never with its value; anything else prints "bad flag".
//   - A bad flag value: (2, false), naming the flag but not the value.
//   - A positional argument: "<prog> CMD: takes no positional arguments",
//     then hint if it is not empty: (2, false). The argument is not echoed.
func Parse(fs *flag.FlagSet, env *Env, args []string, hint string) (code int, ok bool) {
	prefix := fs.Name()
	if msg := checkFlags(fs, args); msg != "" {
		fmt.Fprintf(env.Stderr, "%s: %s\n", prefix, msg)
		return ExitUsage, false
	}
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printHelp(fs, env)
		return ExitOK, false
	case err != nil:
		// checkFlags caught unknown flags and missing values, so this
		// is a value that did not parse; flag's message quotes the
		// value, so print only the flag's name.
		if name := failedFlag(fs, err); name != "" {
			fmt.Fprintf(env.Stderr, "%s: invalid value for flag -%s\n", prefix, name)
		} else {
			fmt.Fprintf(env.Stderr, "%s: bad flag\n", prefix)
		}
		return ExitUsage, false
	case fs.NArg() > 0:
		fmt.Fprintf(env.Stderr, "%s: takes no positional arguments\n", prefix)
		if hint != "" {
			fmt.Fprintln(env.Stderr, hint)
		}
		return ExitUsage, false
	}
	return ExitOK, true
}

// printHelp prints the usage line and the flags to env.Stdout: -h is a
// success, so its output goes where a pager reads it.
func printHelp(fs *flag.FlagSet, env *Env) {
	out := fs.Output()
	fs.SetOutput(env.Stdout)
	defer fs.SetOutput(out)
	if fs.Usage != nil {
		fs.Usage()
		return
	}
	fmt.Fprintf(env.Stdout, "usage: %s [flags]\n", fs.Name())
	hasFlags := false
	fs.VisitAll(func(*flag.Flag) { hasFlags = true })
	if hasFlags {
		fmt.Fprintln(env.Stdout, "\nflags:")
		fs.PrintDefaults()
	}
}

// checkFlags walks args the way flag.FlagSet.Parse does and returns what is
// wrong with the first flag that Parse would refuse as unknown or
// malformed, or "" when all of them are defined. The message never contains
// a flag's value or anything that does not look like a flag name.
func checkFlags(fs *flag.FlagSet, args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			return "" // first positional argument: flags end here
		}
		if a == "--" {
			return ""
		}
		name := a[1:]
		if name[0] == '-' {
			name = name[1:]
		}
		name, _, hasValue := strings.Cut(name, "=")
		if name == "" || name[0] == '-' || name[0] == '=' {
			return "bad flag"
		}
		f := fs.Lookup(name)
		if f == nil {
			if name == "h" || name == "help" {
				return "" // flag answers with ErrHelp
			}
			if looksLikeFlag(a) {
				dashes := "-"
				if strings.HasPrefix(a, "--") {
					dashes = "--"
				}
				return "unknown flag " + dashes + name
			}
			return "bad flag"
		}
		if hasValue || isBoolFlag(f) {
			continue
		}
		if i+1 >= len(args) {
			return "flag -" + name + " needs a value"
		}
		i++ // the value
	}
	return ""
}

// isBoolFlag reports whether f takes no value, as flag decides it.
func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// failedFlag finds the defined flag a parse error names. flag's messages
// read "invalid value %q for flag -NAME: ..." and "invalid boolean value
// %q for -NAME: ...", so the name follows the last " -" before ": ".
// The name is returned only when fs defines it.
func failedFlag(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	for _, marker := range []string{" for flag -", " for -"} {
		i := strings.LastIndex(msg, marker)
		if i < 0 {
			continue
		}
		name, _, _ := strings.Cut(msg[i+len(marker):], ":")
		if fs.Lookup(name) != nil {
			return name
		}
	}
	return ""
}

// looksLikeCommand reports whether s matches ^[a-z][a-z-]{0,31}$.
func looksLikeCommand(s string) bool {
	if len(s) == 0 || len(s) > 32 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c == '-') {
			return false
		}
	}
	return true
}

// looksLikeFlag reports whether s matches ^-{1,2}[a-z][a-z0-9-]{0,31}(=.*)?$.
func looksLikeFlag(s string) bool {
	if !strings.HasPrefix(s, "-") {
		return false
	}
	s = strings.TrimPrefix(s[1:], "-")
	name, _, _ := strings.Cut(s, "=")
	if len(name) == 0 || len(name) > 32 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
