package section

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/host/unit"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

func fakeHost() *unit.Fake {
	f := unit.NewFake()
	f.SetFile("/proc/sys/kernel/msgmax", "8192\n")
	f.SetFile(unit.Pool2M, "0\n")
	return f
}

func registry(t *testing.T, extra ...unit.Unit) *unit.Registry {
	t.Helper()
	r, err := unit.NewRegistry(append([]unit.Unit{unit.Sysctl{}, unit.Hugepages{}, unit.K8sJoin{}}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func pass(t *testing.T, s *Section, body string) (converge.Plan, error) {
	t.Helper()
	p, err := s.Plan(context.Background(), json.RawMessage(body))
	if err != nil {
		t.Fatalf("Plan = %v", err)
	}
	if len(p.Changes) == 0 {
		return p, nil
	}
	return p, s.Apply(context.Background(), json.RawMessage(body), p)
}

func state(s *Section, name string) UnitState {
	for _, u := range s.Units() {
		if u.Name == name {
			return u
		}
	}
	return UnitState{}
}

// A failing unit fails alone: the units after it converge, its condition
// and its line are in the section's state, the section is not converged.
// The fabric manager here is the real unit over a systemctl whose
// nvidia-fabricmanager does not start.
func TestFailingUnitFailsAlone(t *testing.T) {
	f := fakeHost()
	f.SetTool("systemctl", func(_ *unit.Fake, args []string) (string, error) {
		if args[0] == "show" {
			return "LoadState=loaded\nActiveState=failed\nUnitFileState=enabled\n", nil
		}
		return "Job for nvidia-fabricmanager.service failed because the control process exited with error code.", errors.New("exit status 1")
	})
	s := New(Config{Units: registry(t, unit.FabricManager{}), System: f, Direct: true})
	body := `{"sysctl":{"settings":{"kernel.msgmax":"16384"}},"fabric-manager":{"enabled":true},"hugepages":{"pages_2m":8}}`
	p, err := pass(t, s, body)
	if err == nil || converge.IsTerminal(err) || !strings.Contains(err.Error(), "fabric-manager: systemctl enable --now nvidia-fabricmanager.service") {
		t.Fatalf("Apply = %v, want a retryable error naming fabric-manager", err)
	}
	if !strings.Contains(strings.Join(p.Changes, "\n"), "fabric-manager: systemctl enable --now") {
		t.Fatalf("changes %v lack the failing unit's line", p.Changes)
	}
	if v, _ := f.File("/proc/sys/kernel/msgmax"); v != "16384" {
		t.Errorf("sysctl before the failing unit: msgmax %q", v)
	}
	if v, _ := f.File(unit.Pool2M); v != "8" {
		t.Errorf("hugepages after the failing unit: pool %q", v)
	}
	if st := state(s, "fabric-manager"); st.State != Failed {
		t.Errorf("fabric-manager %+v, want FAILED", st)
	}
	if !s.Has(unit.FabricManagerDown) {
		t.Errorf("conditions %v lack FabricManagerDown", s.Conditions())
	}
	// Everything else converged: only the failing unit is left.
	p, _ = s.Plan(context.Background(), json.RawMessage(body))
	if len(p.Changes) != 1 || !s.Has(unit.FabricManagerDown) || state(s, "sysctl").State != Converged || state(s, "hugepages").State != Converged {
		t.Fatalf("second plan %v, states %+v", p.Changes, s.Units())
	}
}

// Only terminal failures make the section's error terminal.
func TestTerminalOnlyWhenEveryFailureIs(t *testing.T) {
	s := New(Config{Units: registry(t), System: fakeHost(), Direct: true})
	_, err := pass(t, s, `{"k8s-join":{"token":"x"},"sysctl":{"settings":{"kernel.msgmax":"9000"}}}`)
	if !converge.IsTerminal(err) || state(s, "k8s-join").State != Unsupported || state(s, "sysctl").State != Changing {
		t.Fatalf("err %v states %+v", err, s.Units())
	}
	// Unprivileged without a helper: refused, terminal, nothing changed.
	f := fakeHost()
	s = New(Config{Units: registry(t), System: f})
	_, err = pass(t, s, `{"sysctl":{"settings":{"kernel.msgmax":"9000"}}}`)
	if !converge.IsTerminal(err) || !strings.Contains(err.Error(), "node-unprivileged") {
		t.Fatalf("err %v", err)
	}
	if v, _ := f.File("/proc/sys/kernel/msgmax"); v != "8192\n" {
		t.Fatalf("msgmax %q changed", v)
	}
}

// [host] units = false: nothing is planned or changed.
func TestOff(t *testing.T) {
	f := fakeHost()
	s := New(Config{Units: registry(t), System: f, Direct: true, Off: true})
	p, err := pass(t, s, `{"sysctl":{"settings":{"kernel.msgmax":"9000"}}}`)
	if err != nil || len(p.Changes) != 0 || state(s, "sysctl").State != Off {
		t.Fatalf("off: %v %v %+v", p.Changes, err, s.Units())
	}
	if v, _ := f.File("/proc/sys/kernel/msgmax"); v != "8192\n" {
		t.Fatalf("msgmax %q changed", v)
	}
}

// The engine's repair pass puts back a hand edit of the sysctl file.
func TestRepairPass(t *testing.T) {
	f := fakeHost()
	s := New(Config{Units: registry(t), System: f, Direct: true})
	e, err := converge.Open(converge.Config{DataDir: t.TempDir(), Sections: []converge.Section{s}, Repair: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.Run(ctx)
	spec := `{"host":{"sysctl":{"settings":{"kernel.msgmax":"16384"}}}}`
	if err := e.Offer(&bcdv1.DesiredState{Generation: 1, Spec: []byte(spec)}, time.Now()); err != nil {
		t.Fatal(err)
	}
	want, _ := waitFile(t, f, unit.SysctlFile, "kernel.msgmax = 16384")
	f.SetFile(unit.SysctlFile, "kernel.msgmax = 1\n")
	start := time.Now()
	if got, _ := waitFile(t, f, unit.SysctlFile, "kernel.msgmax = 16384"); got != want {
		t.Fatalf("repaired to %q, want %q", got, want)
	}
	t.Logf("hand edit repaired after %s", time.Since(start).Round(time.Millisecond))
}

func waitFile(t *testing.T, f *unit.Fake, name, has string) (string, error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, ok := f.File(name); ok && strings.Contains(c, has) {
			return c, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	c, _ := f.File(name)
	t.Fatalf("%s = %q, want it to have %q", name, c, has)
	return "", fmt.Errorf("timeout")
}
