// Package ramdiskkinds holds the ramdisk role's command kinds: disk.wipe
// (components/wipe, per device, never a silent downgrade), deploy.image
// (components/deploy, streamed from the site's cache by digest, else from
// its source URL, through SHA-256 and decompression onto the disk) and
// boot.kexec (kexec_file_load of verified images; the reboot into them
// only after the gateway acked the result).
package ramdiskkinds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/deploy"
	"github.com/better-compute/bcd/components/dispatch"
	"github.com/better-compute/bcd/components/wipe"
)

// Config is what the kinds need.
type Config struct {
	// CacheURL is the site's image cache (bc.cache); images are fetched
	// from CacheURL/images/<sha256> first.
	CacheURL string
	Client   *http.Client
	Log      *slog.Logger
	// allowFiles lets tests name regular files as disks.
	allowFiles bool
	// Seams for tests: the kexec load and the reboot into it.
	kexecLoader func(kernel, initrd []byte, cmdline string) error
	rebootNow   func() error
}

// Kinds returns disk.wipe and deploy.image.
func Kinds(c Config) []dispatch.Kind {
	if c.Client == nil {
		c.Client = &http.Client{Timeout: 6 * time.Hour}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return []dispatch.Kind{
		{Name: "disk.wipe", Lane: dispatch.LaneProvision, Resources: disks("devices"), Run: c.wipe},
		{Name: "deploy.image", Lane: dispatch.LaneProvision, Resources: disks("target"), Run: c.deploy},
		{Name: "boot.kexec", Lane: dispatch.LaneProvision, Resources: func([]byte) ([]string, error) { return []string{"kexec"}, nil },
			Run: c.kexecLoad, AfterAck: c.kexecReboot},
	}
}

// disks locks every disk a command names.
func disks(field string) func([]byte) ([]string, error) {
	return func(b []byte) ([]string, error) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("body: %w", err)
		}
		var list []string
		if err := json.Unmarshal(m[field], &list); err != nil {
			var one string
			if err := json.Unmarshal(m[field], &one); err != nil {
				return nil, fmt.Errorf("body: %q must name disks", field)
			}
			list = []string{one}
		}
		out := make([]string, 0, len(list))
		for _, d := range list {
			out = append(out, "disk:"+filepath.Clean(d))
		}
		return out, nil
	}
}

// checkDisk refuses anything but a block device under /dev.
func (c Config) checkDisk(p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("%q is not a clean absolute path", p)
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if c.allowFiles && st.Mode().IsRegular() {
		return nil
	}
	if !strings.HasPrefix(p, "/dev/") || st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("%s is not a block device under /dev", p)
	}
	return nil
}

type wipeBody struct {
	Devices []string `json:"devices"`
	Mode    string   `json:"mode"`
}

func (c Config) wipe(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body wipeBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	mode, err := wipe.ParseMode(body.Mode)
	if err != nil {
		return nil, fmt.Errorf("body: mode: %w", err)
	}
	if len(body.Devices) == 0 {
		return nil, errors.New(`body: "devices" names no disk`)
	}
	for _, d := range body.Devices {
		if err := c.checkDisk(d); err != nil {
			return nil, fmt.Errorf("body: devices: %w", err)
		}
	}
	var reports []wipe.Report
	var failed []string
	for _, d := range body.Devices {
		r, err := wipe.Wipe(ctx, d, wipe.Options{Mode: mode})
		reports = append(reports, r)
		if err != nil {
			failed = append(failed, err.Error())
		}
		c.Log.Info("wiped", "device", d, "mode", mode, "ok", r.OK, "method", r.Method)
	}
	out, _ := json.Marshal(map[string]any{"mode": mode, "devices": reports})
	if len(failed) > 0 {
		return out, fmt.Errorf("%d of %d devices failed: %s", len(failed), len(body.Devices), strings.Join(failed, "; "))
	}
	return out, nil
}

type deployBody struct {
	Target      string `json:"target"`
	SHA256      string `json:"sha256"`
	URL         string `json:"url,omitempty"`         // the image's source, when the site's cache lacks it
	Compression string `json:"compression,omitempty"` // none, gzip, zstd or empty to sniff
}

func (c Config) deploy(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body deployBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if err := c.checkDisk(body.Target); err != nil {
		return nil, fmt.Errorf("body: target: %w", err)
	}
	comp := deploy.Compression("")
	if body.Compression != "" {
		var err error
		if comp, err = deploy.ParseCompression(body.Compression); err != nil {
			return nil, fmt.Errorf("body: compression: %w", err)
		}
	}
	var sources []string
	if c.CacheURL != "" {
		sources = append(sources, strings.TrimRight(c.CacheURL, "/")+"/images/"+body.SHA256)
	}
	if body.URL != "" {
		u, err := url.Parse(body.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, errors.New(`body: "url" must be an https URL`)
		}
		sources = append(sources, body.URL)
	}
	if len(sources) == 0 {
		return nil, errors.New("no source: the ramdisk has no bc.cache and the command no url")
	}
	var lastErr error
	for _, src := range sources {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.Client.Do(req)
		if err != nil {
			lastErr = fmt.Errorf("GET %s: %w", redact(src), err)
			continue
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			lastErr = fmt.Errorf("GET %s: %s", redact(src), resp.Status)
			continue
		}
		start := time.Now()
		res, err := deploy.Write(ctx, resp.Body, body.SHA256, comp, body.Target, func(p deploy.Progress) {
			c.Log.Info("deploy progress", "target", body.Target, "read", p.Read, "written", p.Written, "done", p.Done)
		})
		resp.Body.Close()
		out, _ := json.Marshal(map[string]any{"source": redact(src), "result": res, "seconds": time.Since(start).Seconds()})
		if err != nil {
			// deploy.Write leaves a mismatched target unbootable; another
			// source is not tried for a bad image.
			return out, err
		}
		return out, nil
	}
	return nil, lastErr
}

// redact drops a URL's query (presigned URLs carry credentials there).
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		u.RawQuery, u.User = "", nil
		return u.String()
	}
	return "(unparsable URL)"
}
