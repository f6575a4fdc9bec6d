package ramdiskkinds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/filehash"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

// kexecBody names the kernel to boot either by digest, from the site's
// cache (the ramdisk again, or another image), or by path in a partition
// of a disk (the kernel an installed OS carries).
type kexecBody struct {
	KernelSHA256 string `json:"kernel_sha256,omitempty"`
	InitrdSHA256 string `json:"initrd_sha256,omitempty"`
	Disk         string `json:"disk,omitempty"`
	Partition    int    `json:"partition,omitempty"`
	Kernel       string `json:"kernel,omitempty"` // a path in that partition, such as boot/vmlinuz
	Initrd       string `json:"initrd,omitempty"`
	Cmdline      string `json:"cmdline"`
}

// kexecResources locks kexec, and the disk a kernel is read from.
func kexecResources(b []byte) ([]string, error) {
	var body kexecBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	res := []string{"kexec"}
	if body.Disk != "" {
		res = append(res, "disk:"+filepath.Clean(body.Disk))
	}
	return res, nil
}

// cleanImagePath checks a path inside an installed OS's partition.
func cleanImagePath(p string) (string, error) {
	c := path.Clean(strings.TrimPrefix(p, "/"))
	if p == "" || c == "." || c == ".." || strings.HasPrefix(c, "../") || strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%q is not a path inside the partition", p)
	}
	return c, nil
}

// readFromDisk reads the kernel and initramfs from partition part of disk,
// mounted read-only, through an os.Root so the image's symlinks cannot
// reach the ramdisk's own files.
func (c Config) readFromDisk(body kexecBody) (kernel, initrd []byte, err error) {
	if err := c.checkDisk(body.Disk); err != nil {
		return nil, nil, fmt.Errorf("body: disk: %w", err)
	}
	if body.Partition < 1 || body.Partition > 128 {
		return nil, nil, errors.New(`body: "partition" must be 1 to 128`)
	}
	kp, err := cleanImagePath(body.Kernel)
	if err != nil {
		return nil, nil, fmt.Errorf("body: kernel: %w", err)
	}
	ip := ""
	if body.Initrd != "" {
		if ip, err = cleanImagePath(body.Initrd); err != nil {
			return nil, nil, fmt.Errorf("body: initrd: %w", err)
		}
	}
	dir, unmount, err := c.mounter()(body.Disk, body.Partition, true)
	if err != nil {
		return nil, nil, err
	}
	defer unmount()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, err
	}
	defer root.Close()
	read := func(p string) ([]byte, error) {
		f, err := root.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxKexecImage+1))
		if err != nil {
			return nil, fmt.Errorf("read /%s: %w", p, err)
		}
		if len(b) > maxKexecImage {
			return nil, fmt.Errorf("/%s is larger than %d bytes", p, maxKexecImage)
		}
		return b, nil
	}
	if kernel, err = read(kp); err != nil {
		return nil, nil, fmt.Errorf("kernel: %w", err)
	}
	if ip != "" {
		if initrd, err = read(ip); err != nil {
			return nil, nil, fmt.Errorf("initrd: %w", err)
		}
	}
	return kernel, initrd, nil
}

// maxKexecImage bounds a kernel or initramfs held in memory.
const maxKexecImage = 512 << 20

// fetchVerified reads an image from the site's cache into memory and
// checks its digest.
func (c Config) fetchVerified(ctx context.Context, digest string) ([]byte, error) {
	if !filehash.ValidDigest(digest) {
		return nil, fmt.Errorf("%q is not a sha256 digest", digest)
	}
	if c.CacheURL == "" {
		return nil, errors.New("the ramdisk has no bc.cache to fetch from")
	}
	u := strings.TrimRight(c.CacheURL, "/") + "/images/" + digest
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxKexecImage+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if len(b) > maxKexecImage {
		return nil, fmt.Errorf("%s is larger than %d bytes", digest, maxKexecImage)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("%s: the bytes fetched have another digest", digest)
	}
	return b, nil
}

// kexecLoad loads the kernel to boot next (kexec_file_load); the reboot
// into it happens only after the gateway acked this command's result
// (kexecReboot), since the ramdisk's journal does not survive it.
func (c Config) kexecLoad(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body kexecBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if len(body.Cmdline) > 2000 || strings.ContainsAny(body.Cmdline, "\n\x00") {
		return nil, errors.New(`body: "cmdline" must be one line of at most 2000 bytes`)
	}
	var kernel, initrd []byte
	var err error
	source := "the site's cache"
	switch {
	case body.Disk != "" && (body.KernelSHA256 != "" || body.InitrdSHA256 != ""):
		return nil, errors.New(`body: name the kernel by digest or by "disk", not both`)
	case body.Disk != "":
		if kernel, initrd, err = c.readFromDisk(body); err != nil {
			return nil, err
		}
		source = fmt.Sprintf("partition %d of %s", body.Partition, body.Disk)
	case body.Kernel != "" || body.Initrd != "" || body.Partition != 0:
		return nil, errors.New(`body: "kernel", "initrd" and "partition" go with "disk"`)
	default:
		if kernel, err = c.fetchVerified(ctx, body.KernelSHA256); err != nil {
			return nil, fmt.Errorf("kernel: %w", err)
		}
		if body.InitrdSHA256 != "" {
			if initrd, err = c.fetchVerified(ctx, body.InitrdSHA256); err != nil {
				return nil, fmt.Errorf("initrd: %w", err)
			}
		}
	}
	if err := c.loader()(kernel, initrd, body.Cmdline); err != nil {
		return nil, err
	}
	ks, is := sha256.Sum256(kernel), sha256.Sum256(initrd)
	c.Log.Info("kexec loaded; rebooting into it once the result is acked", "from", source, "kernel_bytes", len(kernel), "initrd_bytes", len(initrd))
	out := map[string]any{"loaded": true, "from": source, "kernel_bytes": len(kernel), "kernel_sha256": hex.EncodeToString(ks[:]),
		"initrd_bytes": len(initrd), "cmdline": body.Cmdline}
	if initrd != nil {
		out["initrd_sha256"] = hex.EncodeToString(is[:])
	}
	return json.Marshal(out)
}

func (c Config) loader() func(kernel, initrd []byte, cmdline string) error {
	if c.kexecLoader != nil {
		return c.kexecLoader
	}
	return kexecFileLoad
}

func (c Config) kexecReboot(id string) {
	r := c.rebootNow
	if r == nil {
		r = kexecRebootNow
	}
	if err := r(); err != nil {
		c.Log.Error("reboot into the loaded kernel failed", "command_id", id, "err", err)
	}
}
