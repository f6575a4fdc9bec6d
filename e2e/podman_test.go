package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/base/testenv"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/machine/fakehw"
)

// busyboxImage is the image the podman test runs: Debian's static
// busybox alone, imported from a tarball the test makes (no registry).
const busyboxImage = "localhost/bcd-busybox:test"

// importBusybox makes the image from /bin/busybox (busybox-static).
func importBusybox(t *testing.T, podman string) {
	t.Helper()
	bin, err := os.ReadFile(testenv.NeedTool(t, "busybox", "busybox-static"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "dev/", "proc/", "sys/", "etc/", "tmp/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin))})
	tw.Write(bin)
	for _, applet := range []string{"sh", "ls", "cat", "env", "stat", "id"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	tw.Close()
	cmd := exec.Command(podman, "import", "--change", "ENV=PATH=/bin", "-", busyboxImage)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("podman import: %v: %s", err, out)
	}
}

// podmanRun runs `podman run --device bcd.dev/gpu=<alloc> ... IMAGE sh -c
// script` in a mount namespace of its own, where the CDI spec directory
// is the node's (cdiDir) and /dev holds the fake machine's device nodes
// beside the few a container runtime needs. Podman runs with Debian's
// crun and cgroupfs, without cgroups of its own: these machines mix
// cgroup v1 and v2, which crun refuses, so the namespace mounts a plain
// cgroup2 hierarchy and the container gets none (docs/devices.md).
func podmanRun(t *testing.T, cdiDir string, nodes []fakehw.DeviceNode, allocs []string, script string) (string, error) {
	t.Helper()
	var sh strings.Builder
	sh.WriteString("set -e\nmount --make-rprivate /\n")
	sh.WriteString("if [ \"$(stat -f -c %T /sys/fs/cgroup)\" != cgroup2fs ]; then mount -t cgroup2 none /sys/fs/cgroup; fi\n")
	sh.WriteString("mount --bind \"$CDI_DIR\" /etc/cdi\n")
	sh.WriteString("old=$(mktemp -d); mount --bind /dev \"$old\"; mount -t tmpfs -o mode=755 devtmp /dev\n")
	sh.WriteString("for f in null zero full random urandom tty ptmx; do touch /dev/$f; mount --bind \"$old/$f\" /dev/$f; done\n")
	sh.WriteString("for d in shm pts mqueue; do if [ -d \"$old/$d\" ]; then mkdir /dev/$d; mount --bind \"$old/$d\" /dev/$d; fi; done\n")
	for _, n := range nodes {
		fmt.Fprintf(&sh, "mkdir -p %s; mknod -m 666 %s c %d %d\n", filepath.Dir(n.Path), n.Path, n.Major, n.Minor)
	}
	args := "podman --cgroup-manager=cgroupfs run --rm --cgroups=disabled --net=none --ulimit nofile=1024:1024 --ulimit nproc=4096:4096"
	for _, a := range allocs {
		args += " --device bcd.dev/gpu=" + a
	}
	fmt.Fprintf(&sh, "exec %s %s sh -c '%s'\n", args, busyboxImage, script)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "-m", "sh", "-c", sh.String())
	cmd.Env = append(os.Environ(), "CDI_DIR="+cdiDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPodmanSeesHeldGPU: a real container runtime consumes the CDI specs
// bcd writes. Podman runs --device bcd.dev/gpu=<allocation> and the
// container sees exactly the held GPU's device node (and a MIG
// instance's capability nodes), none of the others; a whole-GPU hold
// beside a MIG hold on the same GPU fails alone; after bcgw release the
// same run fails with podman's unknown-device error.
func TestPodmanSeesHeldGPU(t *testing.T) {
	testenv.NeedRoot(t, "podman runs containers as root, and the test mounts and mknods in a mount namespace of its own")
	podman := testenv.NeedTool(t, "podman", "podman")
	testenv.NeedTool(t, "crun", "crun")
	testenv.NeedTool(t, "unshare", "util-linux")
	if err := os.MkdirAll("/etc/cdi", 0o755); err != nil { // the mount point of the node's spec directory
		t.Fatal(err)
	}
	importBusybox(t, podman)

	l := newLab(t)
	g := l.startGateway(filepath.Join(l.root, "gw"), "127.0.0.1:0")
	cfg, id := l.joinNode(g, "n", l.token(g, "--uses", "1"), "node")
	root := filepath.Join(filepath.Dir(cfg), "data", "fakehw", "root")
	seed := fakehw.MIGSeed(11, 7)
	l.startEnv([]string{fmt.Sprintf("BCD_FAKEHW_SEED=%d", seed)}, "bcd-node", "node", "--config", cfg)
	l.waitNode(g, id, "connected", func(n nodeView) bool { return n.Connected })

	gen := l.spec(g, "set", id, `{"devices":{"holds":[
		{"allocation":"whole3","gpus":["3"]},
		{"allocation":"mig7","gpus":["7/gi2/ci0"]},
		{"allocation":"whole7","gpus":["7"]}]}}`)
	sv := l.waitStatus(g, id, "the holds", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	if sec := section(sv, "devices"); sec.State != "FAILED" || !strings.Contains(sec.Message, "1 of 3 holds failed: whole7: resources-exhausted: GPU "+fakehw.GPUUUID(seed, 7)+" is held by mig7") {
		t.Fatalf("devices: %+v", sec)
	}

	nodes := fakehw.DeviceNodes(seed)
	cdiDir := filepath.Join(root, "etc/cdi")
	const list = `ls /dev /dev/nvidia-caps 2>/dev/null | tr "\n" " "; echo; stat -c "%n %t:%T" /dev/nvidia* | tr "\n" " "; echo; env | grep -E "^(BCD|NVIDIA|CUDA)_" | sort | tr "\n" " "`
	out, err := podmanRun(t, cdiDir, nodes, []string{"whole3"}, list)
	if err != nil {
		t.Fatalf("podman run --device bcd.dev/gpu=whole3: %v\n%s", err, out)
	}
	t.Logf("whole3's container:\n%s", out)
	for _, want := range []string{"nvidia3 ", "nvidiactl", "nvidia-uvm", "/dev/nvidia3 c3:3", "BCD_ALLOCATION=whole3", "NVIDIA_VISIBLE_DEVICES=" + fakehw.GPUUUID(seed, 3)} {
		if !strings.Contains(out, want) {
			t.Errorf("whole3's container lacks %q", want)
		}
	}
	for i := range fakehw.GPUCount {
		if i != 3 && strings.Contains(out, fmt.Sprintf("nvidia%d ", i)) {
			t.Errorf("whole3's container sees /dev/nvidia%d", i)
		}
	}
	if strings.Contains(out, "nvidia-caps") {
		t.Error("whole3's container sees a MIG capability node")
	}

	caps, _ := cdispec.ParseMIGCaps(fakehw.MIGCaps())
	capNodes, _ := caps.Nodes(7, 2, 0)
	out, err = podmanRun(t, cdiDir, nodes, []string{"mig7"}, list)
	if err != nil {
		t.Fatalf("podman run --device bcd.dev/gpu=mig7: %v\n%s", err, out)
	}
	t.Logf("mig7's container:\n%s", out)
	for _, want := range []string{"nvidia7 ", filepath.Base(capNodes[0]) + " ", filepath.Base(capNodes[1]), "NVIDIA_VISIBLE_DEVICES=" + fakehw.MIGUUID(seed, 7, 0)} {
		if !strings.Contains(out, want) {
			t.Errorf("mig7's container lacks %q", want)
		}
	}
	if n := len(regexp.MustCompile(`nvidia-cap[0-9]+`).FindAllString(out, -1)); n != 2 || strings.Contains(out, "nvidia3 ") {
		t.Errorf("mig7's container sees more than GPU 7 and its instance's two capabilities")
	}

	gen, _ = parseGen(l.bcgw(g, "release", id, "--alloc", "whole3"))
	l.waitStatus(g, id, "the release", func(s adminapi.StatusView) bool { return s.ObservedGeneration == gen })
	out, err = podmanRun(t, cdiDir, nodes, []string{"whole3"}, "true")
	if err == nil || !strings.Contains(out, "unresolvable CDI devices bcd.dev/gpu=whole3") {
		t.Errorf("podman run of a released hold: %v\n%s", err, out)
	}
}

func parseGen(s string) (uint64, error) {
	var n uint64
	_, err := fmt.Sscan(strings.TrimSpace(s), &n)
	return n, err
}
