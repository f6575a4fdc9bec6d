// Package cli is the command-line frame of every bcd role binary and of
// bcgw: the command table, help, the built-in version command, flag parsing
// and the exit codes (0 success or -h, 1 failure, 2 usage error).
//
// It never echoes what it does not recognise unless it looks like a command
// or flag name, so a join token pasted onto the command line does not end
// up in a terminal log or a support bundle.
package cli

import (
	"fmt"
	"io"
	"os"
)

// Exit codes.
const (
	ExitOK      = 0 // success, or -h
	ExitFailure = 1 // the command ran and failed
	ExitUsage   = 2 // unknown command or flag, positional argument, command not in this build
)

// Env is what a command may touch of its process: standard streams and the
// environment. Tests pass buffers and maps; StdEnv gives the real ones.
// Every field must be set.
type Env struct {
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	Getenv   func(string) string
	Unsetenv func(string) error
}

// StdEnv returns an Env of os.Stdin, os.Stdout, os.Stderr, os.Getenv and
// os.Unsetenv.
func StdEnv() *Env {
	return &Env{
		Stdin:    os.Stdin,
		Stdout:   os.Stdout,
		Stderr:   os.Stderr,
		Getenv:   os.Getenv,
		Unsetenv: os.Unsetenv,
	}
}

// Fail prints "<prefix>: <err>" to env.Stderr and returns ExitFailure.
func Fail(env *Env, prefix string, err error) int {
	fmt.Fprintf(env.Stderr, "%s: %v\n", prefix, err)
	return ExitFailure
}

// Usagef prints the formatted line to env.Stderr and returns ExitUsage.
func Usagef(env *Env, format string, a ...any) int {
	fmt.Fprintf(env.Stderr, format+"\n", a...)
	return ExitUsage
}
