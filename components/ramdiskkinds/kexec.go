package ramdiskkinds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/imagecache"
)

type kexecBody struct {
	KernelSHA256 string `json:"kernel_sha256"`
	InitrdSHA256 string `json:"initrd_sha256,omitempty"`
	Cmdline      string `json:"cmdline"`
}

// maxKexecImage bounds a kernel or initramfs held in memory.
const maxKexecImage = 512 << 20

// fetchVerified reads an image from the site's cache into memory and
// checks its digest.
func (c Config) fetchVerified(ctx context.Context, digest string) ([]byte, error) {
	if !imagecache.ValidDigest(digest) {
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
	kernel, err := c.fetchVerified(ctx, body.KernelSHA256)
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	var initrd []byte
	if body.InitrdSHA256 != "" {
		if initrd, err = c.fetchVerified(ctx, body.InitrdSHA256); err != nil {
			return nil, fmt.Errorf("initrd: %w", err)
		}
	}
	if err := c.loader()(kernel, initrd, body.Cmdline); err != nil {
		return nil, err
	}
	c.Log.Info("kexec loaded; rebooting into it once the result is acked", "kernel_bytes", len(kernel), "initrd_bytes", len(initrd))
	return json.Marshal(map[string]any{"loaded": true, "kernel_bytes": len(kernel), "initrd_bytes": len(initrd), "cmdline": body.Cmdline})
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
