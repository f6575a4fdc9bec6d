// Package sitekinds holds the site role's command kinds for the boot
// server: boot.prepareRamdisk (pull the ramdisk's kernel and initramfs into
// the verified cache, fetch the machine's discovery token with a
// SecretRequest bound to the command, sign the site's discovery assertion
// and store the boot entry) and boot.cleanUp.
package sitekinds

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/filehash"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/session"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/boot/bootparams"
	"github.com/better-compute/bcd/components/boot/bootserver"
	"github.com/better-compute/bcd/components/boot/imagecache"
	"github.com/better-compute/bcd/components/trust/identity"
)

// AssertionTTL is how long a discovery assertion is valid.
const AssertionTTL = time.Hour

// Config is what the kinds need.
type Config struct {
	Config  *config.Config
	Entries *bootserver.Entries
	Cache   *imagecache.Cache
	// Keep spares the images the site needs from eviction, plus extra
	// (nil: only the boot entries' images and extra).
	Keep func(extra ...string)
}

func (c Config) keep(extra ...string) {
	if c.Keep != nil {
		c.Keep(extra...)
		return
	}
	_ = c.Cache.SetKeep(append(c.Entries.Digests(), extra...))
}

type image struct {
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}

type prepareBody struct {
	MAC     string `json:"mac"`
	Kernel  image  `json:"kernel"`
	Initrd  image  `json:"initrd"`
	Console string `json:"console,omitempty"` // default ttyS0
}

// Assertion is what the site signs about a machine it prepared: the
// gateway checks it at the ramdisk's discovery join against the site
// agent's key.
type Assertion struct {
	Issuer      string `json:"iss"` // the site agent's node id
	Site        string `json:"site"`
	MAC         string `json:"mac"`
	TokenSHA256 string `json:"token_sha256"`
	IssuedAt    int64  `json:"iat"`
	Expires     int64  `json:"exp"`
}

// Kinds returns boot.prepareRamdisk, boot.prepareISO and boot.cleanUp.
func Kinds(c Config) []dispatch.Kind {
	return []dispatch.Kind{
		{Name: "boot.prepareRamdisk", Lane: dispatch.LaneProvision, Resources: macResource, Run: c.prepare},
		{Name: "boot.prepareISO", Lane: dispatch.LaneProvision, Resources: macResource, Run: c.prepareISO},
		{Name: "boot.cleanUp", Lane: dispatch.LaneControl, Idempotent: true, Resources: macResource, Run: c.cleanUp},
	}
}

func parseMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, errors.New(`body: "mac" must be a 6-byte MAC`)
	}
	return mac, nil
}

func macResource(b []byte) ([]string, error) {
	var body struct {
		MAC string `json:"mac"`
	}
	_ = json.Unmarshal(b, &body)
	mac, err := parseMAC(body.MAC)
	if err != nil {
		return nil, err
	}
	return []string{"boot:" + mac.String()}, nil
}

// pull is what both prepare kinds start with: the machine's MAC and the
// images' digests checked, the boot URL configured, and the images
// pulled into the cache, kept from eviction (with what entries name)
// while they are pulled.
func (c Config) pull(ctx context.Context, rawMAC string, images map[string]image) (net.HardwareAddr, error) {
	mac, err := parseMAC(rawMAC)
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(images))
	digests := make([]string, 0, len(names))
	for _, name := range names {
		if !filehash.ValidDigest(images[name].SHA256) {
			return nil, fmt.Errorf(`body: "%s.sha256" must be 64 lower-case hex digits`, name)
		}
		digests = append(digests, images[name].SHA256)
	}
	if c.Config.Boot.URL == "" {
		return nil, errors.New("[boot] url is not configured: machines could not fetch their script")
	}
	c.keep(digests...)
	for _, name := range names {
		if err := c.Cache.Pull(ctx, images[name].SHA256, images[name].URL); err != nil {
			return nil, fmt.Errorf("pull %s: %w", images[name].SHA256, err)
		}
	}
	return mac, nil
}

// prepareISOBody is boot.prepareISO's body: the machine and the ISO it
// boots (an installer, a vendor's diagnostics) from the site's cache.
type prepareISOBody struct {
	MAC string `json:"mac"`
	ISO image  `json:"iso"`
}

// prepareISO pulls an ISO into the cache and makes the machine's entry
// boot it with iPXE's sanboot over HTTP, under the machine's grant. The
// ISO gets no bc.* parameters: it is not bcd's ramdisk, and it joins
// nothing.
func (c Config) prepareISO(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body prepareISOBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	mac, err := c.pull(ctx, body.MAC, map[string]image{"iso": body.ISO})
	if err != nil {
		return nil, err
	}
	if err := c.Entries.Put(bootserver.Entry{MAC: mac.String(), ISO: body.ISO.SHA256, Command: dispatch.CommandID(ctx), Created: time.Now().UTC()}); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]string{
		"mac": mac.String(), "script_url": strings.TrimRight(c.Config.Boot.URL, "/") + "/boot/ipxe?mac=" + mac.String(),
	})
}

func (c Config) prepare(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body prepareBody
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	mac, err := c.pull(ctx, body.MAC, map[string]image{"kernel": body.Kernel, "initrd": body.Initrd})
	if err != nil {
		return nil, err
	}
	tok, err := session.CommandSecret(ctx, "discovery-token")
	if err != nil {
		return nil, err
	}
	a, err := identity.Load(c.Config.DataDir)
	if err != nil {
		return nil, err
	}
	assertion, err := sign(a, mac, tok)
	if err != nil {
		return nil, err
	}
	jwk, err := os.ReadFile(c.Config.JoinEncryptionJWKPath())
	if err != nil {
		return nil, fmt.Errorf("the ramdisk needs join-encryption.jwk: %w", err)
	}
	grant := bootserver.NewGrant()
	params, err := bootparams.Render(bootparams.Params{
		Gateway: c.Config.Gateway, ServerName: c.Config.GatewayServerName, ServingCAPin: c.Config.ServingCASPKIPin,
		JoinSigningPin: c.Config.JoinSigningKeyPin, JoinEncryptionPin: c.Config.JoinEncryptionKeyPin, JWK: []byte(strings.TrimSpace(string(jwk))),
		DiscoveryToken: string(tok), Assertion: assertion, Site: a.Site, MAC: mac, CacheURL: strings.TrimRight(c.Config.Boot.URL, "/") + bootserver.CachePath(grant),
	})
	if err != nil {
		return nil, fmt.Errorf("boot parameters: %w", err)
	}
	console := body.Console
	if console == "" {
		console = "ttyS0"
	}
	if strings.ContainsAny(console, " \"'\n") {
		return nil, errors.New(`body: "console" must be one word such as ttyS0,115200`)
	}
	if err := c.Entries.Put(bootserver.Entry{MAC: mac.String(), Kernel: body.Kernel.SHA256, Initrd: body.Initrd.SHA256,
		Cmdline: "console=" + console + " panic=-1 " + params, Command: dispatch.CommandID(ctx), Created: time.Now().UTC(), Grant: grant}); err != nil {
		return nil, err
	}
	// The token stays in the entry (served to that machine only); the
	// output names where the machine's script is.
	return json.Marshal(map[string]string{
		"mac": mac.String(), "script_url": strings.TrimRight(c.Config.Boot.URL, "/") + "/boot/ipxe?mac=" + mac.String(),
	})
}

// sign makes the site's discovery assertion: a compact JWS (ES256) by the
// site agent's node key.
func sign(a *identity.Agent, mac net.HardwareAddr, tok []byte) (string, error) {
	key, ok := a.Key.(*ecdsa.PrivateKey)
	if !ok {
		return "", errors.New("the site's key cannot sign assertions here (not a file key)")
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("bcd-discovery+jwt"))
	if err != nil {
		return "", fmt.Errorf("assertion signer: %w", err)
	}
	sum := sha256.Sum256(tok)
	now := time.Now()
	payload, _ := json.Marshal(Assertion{Issuer: a.NodeID, Site: a.Site, MAC: mac.String(), TokenSHA256: hex.EncodeToString(sum[:]),
		IssuedAt: now.Unix(), Expires: now.Add(AssertionTTL).Unix()})
	jws, err := signer.Sign(payload)
	if err != nil {
		return "", fmt.Errorf("sign assertion: %w", err)
	}
	return jws.CompactSerialize()
}

func (c Config) cleanUp(ctx context.Context, b []byte) (json.RawMessage, error) {
	var body struct {
		MAC string `json:"mac"`
	}
	if err := dispatch.DecodeBody(b, &body); err != nil {
		return nil, err
	}
	mac, err := parseMAC(body.MAC)
	if err != nil {
		return nil, err
	}
	had, err := c.Entries.Remove(mac.String())
	if err != nil {
		return nil, err
	}
	c.keep()
	return json.Marshal(map[string]any{"mac": mac.String(), "removed": had})
}
