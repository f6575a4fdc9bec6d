package nodekinds_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/machine/fakehw"
	"github.com/better-compute/bcd/components/machine/nodekinds"
	"github.com/better-compute/bcd/components/machine/nvsmi"
)

// helperStub is a unix socket that answers every request with answer and
// hands the requests to the test.
func helperStub(t *testing.T, answer string) (string, chan string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	reqs := make(chan string, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			reqs <- string(b)
			c.Write([]byte(answer))
			c.Close()
		}
	}()
	return sock, reqs
}

// TestResetGPUThroughTheHelper: with [helper], the host's GPU reset is bcd
// helper's gpu.reset by UUID, and nvidia-smi is not run by the node; the
// helper's refusal is the reset's error.
func TestResetGPUThroughTheHelper(t *testing.T) {
	dir := t.TempDir()
	ran := filepath.Join(dir, "ran")
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\ntouch "+ran+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	g := nvsmi.GPU{Info: nvsmi.Info{UUID: "GPU-5f1c0a2e-1111-4222-8333-944455556666", PCIBusID: "00000000:18:00.0"}}

	sock, reqs := helperStub(t, `{"v":1,"ok":true}`)
	hw := nodekinds.WithHelper(nodekinds.Host{NvidiaSMI: smi, DataDir: dir}, &helperclient.Client{Socket: sock})
	if err := hw.ResetGPU(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	if got := <-reqs; got != `{"v":1,"op":"gpu.reset","gpu":"`+g.UUID+`"}` {
		t.Errorf("sent %s", got)
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Error("the node ran nvidia-smi itself")
	}

	sock, _ = helperStub(t, `{"v":1,"ok":false,"error":"gpu.reset: GPU-5f1c0a2e-1111-4222-8333-944455556666 is not a GPU of this host (nvidia-smi lists 0)","retryable":false}`)
	hw = nodekinds.WithHelper(nodekinds.Host{NvidiaSMI: smi, DataDir: dir}, &helperclient.Client{Socket: sock})
	err := hw.ResetGPU(context.Background(), g)
	var herr *helperclient.Error
	if !errors.As(err, &herr) || !strings.Contains(err.Error(), "is not a GPU of this host") {
		t.Fatalf("a refused reset: %v", err)
	}

	// Without [helper] the node runs nvidia-smi -r itself.
	if err := (nodekinds.Host{NvidiaSMI: smi, DataDir: dir}).ResetGPU(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Errorf("without [helper] nvidia-smi did not run: %v", err)
	}
}

// TestWithHelperLeavesAFakeMachine: a fakehw machine has nothing
// privileged to route.
func TestWithHelperLeavesAFakeMachine(t *testing.T) {
	fake := fakehw.Hardware{Seed: 1, DataDir: t.TempDir()}
	if got := nodekinds.WithHelper(fake, &helperclient.Client{Socket: "/nonexistent"}); got != nodekinds.Hardware(fake) {
		t.Errorf("WithHelper(fakehw) = %#v", got)
	}
	if got := nodekinds.WithHelper(nodekinds.Host{}, nil); got.(nodekinds.Host).Helper != nil {
		t.Error("a nil client was set")
	}
}
