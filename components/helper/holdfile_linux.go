//go:build linux

package helper

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/components/helper/cdispec"
	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/helper/wire"
)

// maxCheckError bounds the part of a content check's error that is
// answered and logged: the check quotes what it refuses (a key, a device
// path, a variable), and the helper never logs a file's content.
const maxCheckError = 256

// checkHoldFile decides, before anything on disk changes, whether data
// may be written as t: a CDI spec (kind cdi) must pass cdispec.Check for
// allocation t.ID with device nodes only of this host's own GPUs, read
// now; an environment file (kind allocation-env) must pass
// cdispec.CheckEnv; a k8s-token file must be one kubeadm bootstrap token
// (filetable.CheckK8sToken). Other kinds pass. A nil answer lets the
// write go on.
func (srv *server) checkHoldFile(t filetable.Target, data []byte) (*wire.Response, string) {
	var err error
	switch t.Kind {
	case "cdi":
		minors, rerr := srv.hostMinors()
		if rerr != nil {
			return failed(fmt.Errorf("file.write %s: reading this host's GPUs: %w", t.Path(), rerr), true)
		}
		nodes := make([]string, len(minors))
		for i, m := range minors {
			nodes[i] = "/dev/nvidia" + strconv.Itoa(m)
		}
		caps, rerr := srv.hostMIGCaps()
		if rerr != nil {
			return failed(fmt.Errorf("file.write %s: reading this host's MIG capabilities: %w", t.Path(), rerr), true)
		}
		capNodes := caps.Allowed(minors)
		asked := false // a GPU device node the host does not have
		err = cdispec.Check(t.ID, data, func(p string) bool {
			ok := slices.Contains(nodes, p) || slices.Contains(capNodes, p)
			asked = asked || !ok
			return ok
		})
		if err != nil && asked {
			have := "no NVIDIA GPU"
			if len(nodes) > 0 {
				have = "the GPU device nodes " + strings.Join(nodes, ", ")
			}
			return refused(fmt.Errorf("file.write %s: %s (this host has %s)", t.Path(), cutMsg(err.Error()), have))
		}
	case "allocation-env":
		err = cdispec.CheckEnv(data)
	case "k8s-token":
		err = filetable.CheckK8sToken(data)
	default:
		return nil, ""
	}
	if err != nil {
		return refused(fmt.Errorf("file.write %s: %s", t.Path(), cutMsg(err.Error())))
	}
	return nil, ""
}

// hostMinors is this host's NVIDIA GPUs' device minors (a fakehw build:
// its fake machine's).
func (srv *server) hostMinors() ([]int, error) {
	if srv.s.gpuMinors == nil {
		return nil, errors.New("no GPU inventory")
	}
	return srv.s.gpuMinors()
}

// hostMIGCaps is this host's nvidia-caps table (a fakehw build: its fake
// machine's); none without a reader.
func (srv *server) hostMIGCaps() (cdispec.MIGCaps, error) {
	if srv.s.migCaps == nil {
		return cdispec.MIGCaps{}, nil
	}
	return srv.s.migCaps()
}

// hostMIGCaps reads proc's driver/nvidia-caps/mig-minors; a host without
// the nvidia-caps driver has an empty table, so no MIG capability node
// passes.
func hostMIGCaps(proc string) (cdispec.MIGCaps, error) {
	b, err := os.ReadFile(filepath.Join(proc, strings.TrimPrefix(cdispec.MIGMinorsFile, "/proc/")))
	if errors.Is(err, fs.ErrNotExist) {
		return cdispec.MIGCaps{}, nil
	}
	if err != nil {
		return nil, err
	}
	return cdispec.ParseMIGCaps(b)
}

// cutMsg cuts a check's error to maxCheckError bytes.
func cutMsg(s string) string {
	if len(s) <= maxCheckError {
		return s
	}
	return strings.ToValidUTF8(s[:maxCheckError], "") + "..."
}

// hostGPUMinors reads the device minors of the host's NVIDIA GPUs from
// proc, the procfs mount: the "Device Minor:" line of each
// driver/nvidia/gpus/<bus id>/information. A host without the NVIDIA
// driver has none. A GPU gone between the listing and the read is left
// out; any other file that cannot be read, or that does not give exactly
// one minor of 0 to 254, is an error (the helper allows nothing it has
// not read back exactly).
func hostGPUMinors(proc string) ([]int, error) {
	dir := filepath.Join(proc, "driver/nvidia/gpus")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if len(ents) > maxGPUs {
		return nil, fmt.Errorf("%s lists more than %d GPUs", dir, maxGPUs)
	}
	var minors []int
	for _, e := range ents {
		p := filepath.Join(dir, e.Name(), "information")
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		m, err := parseDeviceMinor(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if !slices.Contains(minors, m) {
			minors = append(minors, m)
		}
	}
	slices.Sort(minors)
	return minors, nil
}

// parseDeviceMinor reads the one "Device Minor:" line of a GPU's
// information file: a decimal of 0 to 254 without sign or leading zero
// (255 is /dev/nvidiactl).
func parseDeviceMinor(b []byte) (int, error) {
	minor := -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "Device Minor" {
			continue
		}
		if minor >= 0 {
			return 0, errors.New("two Device Minor lines")
		}
		v = strings.TrimSpace(v)
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 254 || strconv.Itoa(n) != v {
			return 0, fmt.Errorf("Device Minor %q is not a number of 0 to 254", short(v))
		}
		minor = n
	}
	if minor < 0 {
		return 0, errors.New("no Device Minor line")
	}
	return minor, nil
}
