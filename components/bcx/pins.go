package bcx

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"
)

// Pin is one line of the pins file: a plugin's file name in [plugins] dir
// and the SHA-256 its binary must have.
type Pin struct {
	Name string
	Sum  [32]byte
}

// DriverID is the driver the plugin must say it is: its name after "bcx-".
func (p Pin) DriverID() string { return strings.TrimPrefix(p.Name, PluginPrefix) }

// maxPins bounds the pins file: lines and plugins.
const (
	maxPinsBytes = 64 << 10
	maxPins      = 256
)

// ParsePins parses a pins file: lines "<64 hex digits>  <file name>" (as
// sha256sum prints them; one or more spaces or tabs), blank lines and
// lines starting with '#'. A name is bcx-<driver id>, a plain file name in
// the plugins directory. A name listed twice, or anything else, is an
// error naming the line; errors never quote more of the line than the name.
func ParsePins(b []byte) ([]Pin, error) {
	if len(b) > maxPinsBytes {
		return nil, fmt.Errorf("pins: larger than %d bytes", maxPinsBytes)
	}
	var out []Pin
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 1024), maxPinsBytes)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("pins line %d: want \"<sha256 hex>  <file name>\"", n)
		}
		sum, name := f[0], strings.TrimPrefix(f[1], "*") // sha256sum -b marks binary mode with *
		var p Pin
		if len(sum) != 64 {
			return nil, fmt.Errorf("pins line %d: the SHA-256 must be 64 hex digits", n)
		}
		if _, err := hex.Decode(p.Sum[:], []byte(sum)); err != nil {
			return nil, fmt.Errorf("pins line %d: the SHA-256 must be 64 hex digits", n)
		}
		if !strings.HasPrefix(name, PluginPrefix) || !ValidDriverID(strings.TrimPrefix(name, PluginPrefix)) {
			return nil, fmt.Errorf("pins line %d: a plugin's file name is bcx-<driver id> (lower-case letters, digits, '-'; at most 32 after bcx-)", n)
		}
		if seen[name] {
			return nil, fmt.Errorf("pins line %d: %s is pinned twice", n, name)
		}
		if len(out) == maxPins {
			return nil, fmt.Errorf("pins: more than %d plugins", maxPins)
		}
		seen[name] = true
		p.Name = name
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pins: %w", err)
	}
	return out, nil
}
