//go:build linux

package helper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/helper/helperclient"
)

// peerChildEnv makes the test binary the caller of TestPeerCheckRealCredentials.
const peerChildEnv = "BCD_HELPER_PEER_CHILD"

// TestPeerCheckRealCredentials runs the helper's real peer check
// (SO_PEERCRED and /proc/PID/exe, no seam) against callers that are other
// processes, with or without root: each caller is this test binary (a copy
// the helper takes as its own binary) started in a user namespace of its
// own, where it is root. Without root that namespace maps the test's uid,
// with root it maps nobody (65534): either way the helper must see the
// caller's uid in its own namespace, not the root the caller is in its
// namespace. The helper's user is that uid: allowed; another uid, or that
// uid with another primary group: refused; another copy of the binary (not
// bcd): refused.
func TestPeerCheckRealCredentials(t *testing.T) {
	if os.Getenv(peerChildEnv) != "" {
		return
	}
	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	// otherGID is the helper user's group in the gid case: without root
	// the helper can give its socket only a group the test's user is in.
	otherGID := gid + 1
	if os.Geteuid() == 0 {
		uid, gid, otherGID = 65534, 65534, 65535
	} else {
		otherGID = 0
		groups, _ := os.Getgroups()
		for _, g := range groups {
			if uint32(g) != gid {
				otherGID = uint32(g)
			}
		}
	}
	// Directories the caller (maybe nobody) can traverse: the binaries
	// and the socket live below them.
	base := t.TempDir()
	must(t, os.Chmod(base, 0o755))
	must(t, os.Chmod(filepath.Dir(base), 0o755))
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bcd, other := filepath.Join(base, "bcd"), filepath.Join(base, "other")
	copyFile(t, self, bcd)
	copyFile(t, self, other)

	start := func(t *testing.T, user [2]uint32) *testHelper {
		return startHelper(t, func(c *Config, s *seams) {
			s.lookupUser = func(string) (uint32, uint32, error) { return user[0], user[1], nil }
			s.self = func() (os.FileInfo, error) { return os.Stat(bcd) }
		})
	}
	for _, tt := range []struct {
		name   string    // the helper's user running bcd; another uid; that user with another primary group; a binary that is not bcd
		user   [2]uint32 // the helper's [helper] user
		bin    string
		reason string // "" when allowed
	}{
		// Short names: the socket's path holds them, within 108 bytes.
		{"user", [2]uint32{uid, gid}, bcd, ""},
		{"uid", [2]uint32{uid + 1, gid}, bcd, fmt.Sprintf("uid %d gid %d is neither", uid, gid)},
		{"gid", [2]uint32{uid, otherGID}, bcd, fmt.Sprintf("uid %d gid %d is neither", uid, gid)},
		{"exe", [2]uint32{uid, gid}, other, "exe is not bcd"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.user[1] == 0 {
				testenv.NotApplicable(t, "without root the helper's socket can have another group only when the test's user is in a second group; it is in none")
			}
			h := start(t, tt.user)
			must(t, os.Chmod(h.dir, 0o755))
			must(t, os.Chmod(filepath.Dir(h.dir), 0o755))
			// The socket's mode (0660, the user's group) keeps other
			// callers out first; opened up, the peer check must.
			must(t, os.Chmod(h.socket, 0o666))
			out, pid := peerCall(t, tt.bin, h.socket, uid, gid)
			if tt.reason == "" {
				if out != "ok" {
					t.Fatalf("the peer check: %s (as uid %d gid %d, the helper's user) was refused: %s", tt.bin, uid, gid, out)
				}
				return
			}
			if !strings.Contains(out, "not allowed") {
				t.Fatalf("the peer check: %s as uid %d gid %d (root in its user namespace) was allowed, the helper's user being uid %d gid %d: %s",
					filepath.Base(tt.bin), uid, gid, tt.user[0], tt.user[1], out)
			}
			refused := h.logs.lines(t, "helper: connection refused")
			last := refused[len(refused)-1]
			if last["pid"] != float64(pid) || last["uid"] != float64(uid) || !strings.Contains(last["reason"].(string), tt.reason) {
				t.Errorf("logged %v, want pid %d uid %d and a reason containing %q", last, pid, uid, tt.reason)
			}
		})
	}
}

// peerCall runs bin (a copy of this test binary) as the caller, root in a
// new user namespace whose root is uid and gid outside, and returns what
// its request got ("ok" or the error) and its pid.
func peerCall(t *testing.T, bin, socket string, uid, gid uint32) (string, int) {
	t.Helper()
	cmd := exec.Command(bin, "-test.run", "^TestPeerChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), peerChildEnv+"="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(uid), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(gid), Size: 1}},
		// Root's child keeps root's ids until it takes the namespace's 0.
		Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EINVAL) {
			testenv.Skip(t, "this kernel gives no user namespace to an unprivileged process (%v): sysctl user.max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns", err)
		}
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the caller: %v\n%s", err, out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if r, ok := strings.CutPrefix(line, "peer-call: "); ok {
			return r, pid
		}
	}
	t.Fatalf("the caller said no result:\n%s", out.String())
	return "", 0
}

// TestPeerChild is the caller of TestPeerCheckRealCredentials: it checks
// it is root in its user namespace, then writes a CDI spec through the
// helper and prints what it got.
func TestPeerChild(t *testing.T) {
	socket := os.Getenv(peerChildEnv)
	if socket == "" {
		return
	}
	if os.Getuid() != 0 {
		t.Fatalf("the caller is uid %d in its user namespace, want 0", os.Getuid())
	}
	c := &helperclient.Client{Socket: socket}
	res := "ok"
	var herr *helperclient.Error
	if err := c.WriteFile(context.Background(), "/etc/cdi/bcd-peer.json", holdSpec(t, "peer", "/dev/nvidia1")); errors.As(err, &herr) {
		res = herr.Msg
	} else if err != nil {
		res = err.Error()
	}
	fmt.Println("peer-call: " + res)
}
