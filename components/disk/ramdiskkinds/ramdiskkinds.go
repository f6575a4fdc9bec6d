// Package ramdiskkinds holds the ramdisk role's command kinds: disk.wipe
// (components/disk/wipe, per device, never a silent downgrade), deploy.image
// (components/disk/deploy, streamed from the site's cache by digest, else from
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

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/disk/deploy"
	"github.com/better-compute/bcd/components/disk/osinstall"
	"github.com/better-compute/bcd/components/disk/wipe"
)

// Config is what the kinds need.
type Config struct {
	// CacheURL is the site's image cache (bc.cache); images are fetched
	// from CacheURL/images/<sha256> first.
	CacheURL string
	Client   *http.Client
	Log      *slog.Logger
	// OS is what deploy.image writes into the OS it installed, with an
	// "os" section: the config.toml rendered from the ramdisk's boot
	// parameters and the same join-encryption.jwk.
	OS OSFiles
	// allowFiles lets tests name regular files as disks.
	allowFiles bool
	// Seams for tests: mounting a partition of a disk, and the gateway's
	// secrets for the running command.
	mount  func(disk string, part int, readOnly bool) (string, func() error, error)
	secret func(ctx context.Context, name string) ([]byte, error)
	// Seams for tests: the kexec load and the reboot into it.
	kexecLoader func(kernel, initrd []byte, cmdline string) error
	rebootNow   func() error
}

// OSFiles are the files every installed OS gets.
type OSFiles struct {
	ConfigTOML []byte
	JWK        []byte
}

// Kinds returns disk.wipe, deploy.image and boot.kexec.
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
		{Name: "boot.kexec", Lane: dispatch.LaneProvision, Resources: kexecResources, Run: c.kexecLoad, AfterAck: c.kexecReboot},
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
	id := dispatch.CommandID(ctx)
	for i, d := range body.Devices {
		session.ReportProgress(ctx, id, map[string]any{"device": d, "mode": mode, "devices_done": i, "devices": len(body.Devices)})
		r, err := wipe.Wipe(ctx, d, wipe.Options{Mode: mode})
		reports = append(reports, r)
		if err != nil {
			failed = append(failed, err.Error())
		}
		c.Log.Info("wiped", "command_id", id, "device", d, "mode", mode, "ok", r.OK, "method", r.Method)
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
	// OS, when given, configures the installed OS once the image is
	// written: its partition (1-based) gets the config.toml, the
	// join-encryption.jwk, with node_id a provisioned join token and the
	// node id (bcd join --node-id), and with user_data the command's user
	// data in that format.
	OS *osSection `json:"os,omitempty"`
}

type osSection struct {
	Partition int    `json:"partition"`
	NodeID    string `json:"node_id,omitempty"`
	UserData  string `json:"user_data,omitempty"` // nocloud or ignition
}

// The secrets deploy.image asks the gateway for (components/gateway).
const (
	secretProvisionedToken = "provisioned-token"
	secretUserData         = "user-data"
)

func (o *osSection) check() error {
	if o.Partition < 1 || o.Partition > 128 {
		return errors.New(`body: os: "partition" must be 1 to 128`)
	}
	if o.UserData != "" {
		if err := osinstall.CheckFormat(o.UserData); err != nil {
			return fmt.Errorf("body: os: %w", err)
		}
		if o.UserData == osinstall.NoCloud && o.NodeID == "" {
			return errors.New(`body: os: NoCloud user data needs "node_id" (its instance id)`)
		}
	}
	return nil
}

func (c Config) deploy(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body deployBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	if err := c.checkDisk(body.Target); err != nil {
		return nil, fmt.Errorf("body: target: %w", err)
	}
	if body.OS != nil {
		if err := body.OS.check(); err != nil {
			return nil, err
		}
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
	// The secrets come before the disk is touched: a refusal leaves it as
	// it was.
	var files osinstall.Files
	if body.OS != nil {
		var err error
		if files, err = c.osFiles(ctx, body.OS); err != nil {
			return nil, err
		}
		defer clear(files.Token)
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
		var last time.Time
		id := dispatch.CommandID(ctx)
		w := &deploy.Writer{ProgressEvery: 8 << 20}
		res, err := w.Write(ctx, resp.Body, body.SHA256, comp, body.Target, func(p deploy.Progress) {
			// At most one report a second, and the last one.
			if !p.Done && time.Since(last) < time.Second {
				return
			}
			last = time.Now()
			c.Log.Info("deploy progress", "command_id", id, "target", body.Target, "read", p.Read, "written", p.Written, "done", p.Done)
			session.ReportProgress(ctx, id, map[string]any{"target": body.Target, "read": p.Read, "written": p.Written,
				"seconds": time.Since(start).Seconds(), "done": p.Done})
		})
		resp.Body.Close()
		report := map[string]any{"source": redact(src), "result": res, "seconds": time.Since(start).Seconds()}
		if err != nil {
			// deploy.Write leaves a mismatched target unbootable; another
			// source is not tried for a bad image.
			out, _ := json.Marshal(report)
			return out, err
		}
		if body.OS != nil {
			written, err := c.configureOS(body.Target, body.OS.Partition, files)
			report["os"] = map[string]any{"partition": body.OS.Partition, "files": written}
			if err != nil {
				// An installed OS that cannot join must not boot either.
				report["unbootable"] = deploy.Unbootable(body.Target, res.Written)
				out, _ := json.Marshal(report)
				return out, fmt.Errorf("configure the installed OS: %w", err)
			}
			c.Log.Info("installed OS configured", "target", body.Target, "partition", body.OS.Partition, "files", written, "node_id", body.OS.NodeID)
		}
		out, _ := json.Marshal(report)
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

// osFiles gathers what the installed OS gets: the ramdisk's config.toml
// and key, and the secrets bound to this command.
func (c Config) osFiles(ctx context.Context, o *osSection) (osinstall.Files, error) {
	f := osinstall.Files{ConfigTOML: c.OS.ConfigTOML, JWK: c.OS.JWK, NodeID: o.NodeID, Format: o.UserData}
	if len(f.ConfigTOML) == 0 || len(f.JWK) == 0 {
		return f, errors.New("this ramdisk has no configuration to give an installed OS")
	}
	if o.NodeID != "" {
		tok, err := c.secretFor(ctx, secretProvisionedToken)
		if err != nil {
			return f, fmt.Errorf("the provisioned join token: %w", err)
		}
		f.Token = tok
	}
	if o.UserData != "" {
		ud, err := c.secretFor(ctx, secretUserData)
		if err != nil {
			return f, fmt.Errorf("user data: %w", err)
		}
		f.UserData = ud
	}
	return f, nil
}

func (c Config) secretFor(ctx context.Context, name string) ([]byte, error) {
	if c.secret != nil {
		return c.secret(ctx, name)
	}
	return session.CommandSecret(ctx, name)
}

func (c Config) mounter() func(string, int, bool) (string, func() error, error) {
	if c.mount != nil {
		return c.mount
	}
	return mountPartition
}

// configureOS mounts the installed OS's partition and writes its files.
func (c Config) configureOS(disk string, part int, f osinstall.Files) ([]string, error) {
	dir, unmount, err := c.mounter()(disk, part, false)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		unmount()
		return nil, err
	}
	written, err := osinstall.Write(root, f)
	root.Close()
	if uerr := unmount(); err == nil {
		err = uerr
	}
	return written, err
}
