// Package roles lists the commands the product documents, with the line a
// build that lacks one prints, so every role binary answers the same way.
// It imports nothing but the cli frame, buildinfo and x/sys/unix, so the
// helper can link it. Main also makes every role's process not dumpable.
package roles

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/better-compute/bcd/components/base/buildinfo"
	"github.com/better-compute/bcd/components/base/cli"
)

// Documented is every bcd command of the product's commands page. An empty
// line prints "bcd NAME: not in this build (ROLE)".
func Documented() map[string]string {
	return map[string]string{
		"node": "", "site": "", "ramdisk": "", "helper": "", "join": "", "status": "", "doctor": "",
		"hardware": "", "update": "", "version": "",
		"sim": "bcd sim: needs a fakehw build (go build -tags fakehw)",
	}
}

// Main runs a role binary's command table and exits; SIGINT and SIGTERM
// cancel the context so agent modes stop cleanly with exit 0.
// notYet overrides Documented's line for commands a role will have but
// whose feature has not landed.
func Main(role string, cmds []cli.Command, notYet map[string]string) {
	if err := notDumpable(); err != nil {
		fmt.Fprintf(os.Stderr, "bcd: prctl(PR_SET_DUMPABLE, 0): %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	doc := Documented()
	for k, v := range notYet {
		doc[k] = v
	}
	p := &cli.Program{
		Name: "bcd", Role: role, Commands: cmds, Documented: doc,
		Version: cli.VersionInfo{Version: buildinfo.Version, Commit: buildinfo.Commit, Tags: buildinfo.Tags()},
	}
	code := p.Main(ctx, cli.StdEnv(), os.Args[1:])
	stop()
	os.Exit(code)
}
