package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/components/base/cli"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/trust/ticket"
)

// tunnelCmd is `bcgw tunnel NODE [--instance ID] --ssh|--tcp PORT`:
// standard input and output carried to the node's loopback sshd or port,
// or with --instance to port 22 or PORT of that instance's own address
// (NODE may be left out then: the gateway finds the node connected to
// it whose spec runs the instance), so it serves as an ssh ProxyCommand:
//
//	ssh -o ProxyCommand='bcgw tunnel NODE --ssh' user@NODE
//	ssh -o ProxyCommand='bcgw tunnel --instance vm-1 --ssh' user@vm-1
func tunnelCmd(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "tunnel")
	var a adminFlags
	a.register(fs)
	sshFlag := fs.Bool("ssh", false, "to the node's loopback sshd (with --instance: the instance's port 22)")
	tcp := fs.Int("tcp", 0, "to this loopback TCP port of the node (with --instance: this port of the instance's own address)")
	instance := fs.String("instance", "", "to this instance of the node, never to the node itself")
	account := fs.String("account", "", "who asks (recorded in the node's journal events)")
	ttl := fs.Duration("ttl", agentsvc.DefaultTicketTTL, "the exec ticket's lifetime: the tunnel closes then")
	const usage = "bcgw tunnel NODE --ssh|--tcp PORT | [NODE] --instance ID --ssh|--tcp PORT [--account NAME] [--ttl 15m]"
	node, code, ok := nodeOrInstance(fs, env, args, instance, usage)
	if !ok {
		return code
	}
	var kind string
	switch {
	case *sshFlag && *tcp == 0:
		kind = ticket.KindSSH
	case !*sshFlag && *tcp > 0 && *tcp <= 65535:
		kind = ticket.TCP(*tcp)
	default:
		return cli.Usagef(env, "bcgw tunnel: give --ssh or --tcp PORT (1 to 65535)\nusage: %s", usage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw tunnel", err)
	}
	conn, _, err := c.Tunnel(ctx, node, adminapi.TunnelRequest{Kind: kind, Account: *account, TTL: *ttl, Instance: *instance})
	if err != nil {
		return cli.Fail(env, "bcgw tunnel", err)
	}
	defer conn.Close()
	fw := &frameWriter{w: conn}
	go func() {
		copyFrames(fw, env.Stdin)
	}()
	if _, err := io.Copy(env.Stdout, conn); err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
		return cli.Fail(env, "bcgw tunnel", err)
	}
	return 0
}

// nodeOrInstance parses a tunnel's arguments: NODE, which only an
// instance tunnel (--instance) may leave out ("" then).
func nodeOrInstance(fs *flag.FlagSet, env *cli.Env, args []string, instance *string, usage string) (string, int, bool) {
	pos, code, ok := parseInterleaved(fs, env, args, -1, usage)
	switch {
	case !ok:
		return "", code, false
	case len(pos) == 1:
		return pos[0], 0, true
	case len(pos) == 0 && *instance != "":
		return "", 0, true
	}
	return "", cli.Usagef(env, "usage: %s", usage), false
}

// frameWriter serializes client frames onto the tunnel.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(typ byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return adminapi.WriteTunnelFrame(f.w, typ, p)
}

// copyFrames sends r as data frames, then a close frame at its end.
func copyFrames(fw *frameWriter, r io.Reader) {
	buf := make([]byte, adminapi.MaxTunnelFrame)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if fw.frame(adminapi.TunnelFrameData, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			_ = fw.frame(adminapi.TunnelFrameClose, nil)
			return
		}
	}
}

// console is `bcgw console NODE --account A`: an interactive login shell
// of the account on a pseudo-terminal of the node, the local terminal in
// raw mode and its size forwarded. `bcgw console NODE --instance ID` is
// the serial console of that instance instead (--account then only says
// who asked).
func console(ctx context.Context, env *cli.Env, args []string) int {
	fs := cli.NewFlagSet(env, "bcgw", "console")
	var a adminFlags
	a.register(fs)
	account := fs.String("account", "", "the local account whose login shell runs (never root unless the node's root config allows it); with --instance, who asks")
	instance := fs.String("instance", "", "the serial console of this instance of the node instead of a shell")
	ttl := fs.Duration("ttl", agentsvc.DefaultTicketTTL, "the exec ticket's lifetime: the console closes then")
	const usage = "bcgw console NODE --account ACCOUNT | [NODE] --instance ID [--ttl 15m]"
	node, code, ok := nodeOrInstance(fs, env, args, instance, usage)
	if !ok {
		return code
	}
	if *account == "" && *instance == "" {
		return cli.Usagef(env, "bcgw console: --account or --instance is needed\nusage: %s", usage)
	}
	c, err := a.client()
	if err != nil {
		return cli.Fail(env, "bcgw console", err)
	}
	conn, _, err := c.Tunnel(ctx, node, adminapi.TunnelRequest{Kind: ticket.KindConsole, Account: *account, TTL: *ttl, Instance: *instance})
	if err != nil {
		return cli.Fail(env, "bcgw console", err)
	}
	defer conn.Close()
	fw := &frameWriter{w: conn}
	if f, ok := env.Stdin.(*os.File); ok {
		fd := int(f.Fd())
		if old, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
			raw := *old
			makeRaw(&raw)
			if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err == nil {
				defer unix.IoctlSetTermios(fd, unix.TCSETS, old)
			}
			resize := func() {
				if ws, err := unix.IoctlGetWinsize(fd, unix.TIOCGWINSZ); err == nil && ws.Row > 0 && ws.Col > 0 {
					var p [4]byte
					binary.BigEndian.PutUint16(p[:], ws.Row)
					binary.BigEndian.PutUint16(p[2:], ws.Col)
					_ = fw.frame(adminapi.TunnelFrameResize, p[:])
				}
			}
			resize()
			winch := make(chan os.Signal, 1)
			signal.Notify(winch, syscall.SIGWINCH)
			defer signal.Stop(winch)
			go func() {
				for range winch {
					resize()
				}
			}()
		}
	}
	go copyFrames(fw, env.Stdin)
	_, _ = io.Copy(env.Stdout, conn)
	return 0
}

// makeRaw is cfmakeraw(3): no echo, no line editing, no signals from
// keys, no output processing, 8-bit bytes one at a time.
func makeRaw(t *unix.Termios) {
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
}
