package ramdiskcmd

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/boot/bootparams"
)

func pin(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256/" + base64.StdEncoding.EncodeToString(sum[:])
}

// The installed OS's config.toml loads with the node's strict parser and
// names the ramdisk's gateway, pins and site with the default data_dir;
// no secret of the boot parameters reaches it.
func TestInstalledConfig(t *testing.T) {
	p := &bootparams.Params{Gateway: "https://10.77.0.1:8443", ServerName: "gw.lab", ServingCAPin: pin("ca"),
		JoinSigningPin: pin("sig"), JoinEncryptionPin: pin("enc"), Site: "pxe", DiscoveryToken: "bcjt_secret_token"}
	b, err := InstalledConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(b, config.DefaultPath)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if c.Gateway != p.Gateway || c.GatewayServerName != "gw.lab" || c.ServingCASPKIPin != p.ServingCAPin ||
		c.JoinSigningKeyPin != p.JoinSigningPin || c.JoinEncryptionKeyPin != p.JoinEncryptionPin ||
		c.Site.Name != "pxe" || c.DataDir != config.DefaultDataDir {
		t.Fatalf("config %+v", c)
	}
	if strings.Contains(string(b), "secret") {
		t.Fatal("the discovery token reached the installed OS's config")
	}
}
