//go:build !linux

package bcx

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ShimName is the hidden subcommand bcd re-executes itself as to start a
// plugin (Linux only).
const ShimName = "__bcx-exec"

var errNoSandbox = errors.New("bcx plugins run only on Linux (memfd, seccomp)")

func hashedCopy(string, [32]byte) (*os.File, error) { return nil, errNoSandbox }

// Shim is __bcx-exec; off Linux it only fails.
func Shim(_ []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "bcd %s: %v\n", ShimName, errNoSandbox)
	return 1
}

const sandboxSupported = false
