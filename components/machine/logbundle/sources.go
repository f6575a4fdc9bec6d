package logbundle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// MaxSourceBytes bounds what FileSource and CommandSource read of one
// file or command; the rest is dropped and the source's error says so.
const MaxSourceBytes = 64 << 20

// maxStderr bounds the standard error CommandSource keeps for its error.
const maxStderr = 4 << 10

// FileSource reads the file at path as the bundle's file name. A missing
// or unreadable file is the source's error.
func FileSource(name, path string) Source {
	return Source{Name: name, Read: func(ctx context.Context) ([]byte, error) {
		return readFile(path, MaxSourceBytes)
	}}
}

func readFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return data, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return data[:limit], fmt.Errorf("%s is larger than %d bytes; the rest was not read", path, limit)
	}
	return data, nil
}

// CommandSource runs argv (argv[0] looked up in PATH), bounded by timeout
// (none when 0), and stores its standard output as the bundle's file
// name. A missing binary, a failed run or a non-zero exit is the source's
// error, with the start of its standard error; the output it wrote is
// kept.
func CommandSource(name string, argv []string, timeout time.Duration) Source {
	return Source{Name: name, Read: func(ctx context.Context) ([]byte, error) {
		return runCommand(ctx, argv, timeout, MaxSourceBytes)
	}}
}

func runCommand(ctx context.Context, argv []string, timeout time.Duration, limit int) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	stdout := &capped{limit: limit}
	stderr := &capped{limit: maxStderr}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	out := stdout.buf.Bytes()
	line := strings.Join(argv, " ")
	switch {
	case err != nil && ctx.Err() != nil:
		return out, fmt.Errorf("%s: %w", line, ctx.Err())
	case err != nil:
		if msg := firstLine(stderr.buf.Bytes()); msg != "" {
			return out, fmt.Errorf("%s: %w: %s", line, err, msg)
		}
		return out, fmt.Errorf("%s: %w", line, err)
	case stdout.dropped > 0:
		return out, fmt.Errorf("%s: output larger than %d bytes; %d bytes were dropped", line, limit, stdout.dropped)
	}
	return out, nil
}

// capped keeps the first limit bytes written to it and counts the rest.
type capped struct {
	buf     bytes.Buffer
	limit   int
	dropped int64
}

func (c *capped) Write(p []byte) (int, error) {
	room := max(c.limit-c.buf.Len(), 0)
	if len(p) > room {
		c.dropped += int64(len(p) - room)
		c.buf.Write(p[:room])
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}

func firstLine(b []byte) string {
	line, _, _ := bytes.Cut(bytes.TrimSpace(b), []byte("\n"))
	return strings.TrimSpace(string(line))
}

// StandardSources are the files of a node's logs.collect bundle:
// config.toml from configPath; identity.json and faults.json from dataDir
// (never node.key); the journal of the bcd and bcd-helper units over the
// last since (24 hours when 0); the kernel log; and nvidia-smi -q. A host
// without journalctl, dmesg access or nvidia-smi records that source's
// error.
func StandardSources(configPath, dataDir string, since time.Duration) []Source {
	if since <= 0 {
		since = 24 * time.Hour
	}
	const cmdTimeout = time.Minute
	journal := CommandSource("journal.txt", []string{
		"journalctl", "--no-pager", "--output=short-iso", "-u", "bcd", "-u", "bcd-helper",
		fmt.Sprintf("--since=-%ds", int64(since/time.Second)),
	}, cmdTimeout)
	journal.Tail = true
	dmesg := CommandSource("dmesg.txt", []string{"dmesg"}, cmdTimeout)
	dmesg.Tail = true
	return []Source{
		FileSource("config.toml", configPath),
		FileSource("identity.json", filepath.Join(dataDir, "identity.json")),
		FileSource("faults.json", filepath.Join(dataDir, "faults.json")),
		journal,
		dmesg,
		CommandSource("nvidia-smi.txt", []string{"nvidia-smi", "-q"}, cmdTimeout),
	}
}
