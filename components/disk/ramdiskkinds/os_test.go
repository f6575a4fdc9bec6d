package ramdiskkinds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/components/agent/dispatch"
	"github.com/better-compute/bcd/components/agent/session"
)

// fakePartition stands in for mounting a partition: a directory holds the
// partition's files, and mounts are counted.
type fakePartition struct {
	dir     string
	mounted int
	ro      []bool
}

func (f *fakePartition) mount(disk string, part int, ro bool) (string, func() error, error) {
	if part != 1 {
		return "", nil, errors.New("no such partition")
	}
	f.mounted++
	f.ro = append(f.ro, ro)
	return f.dir, func() error { f.mounted--; return nil }, nil
}

func imageServer(t *testing.T, img []byte) (string, string) {
	t.Helper()
	s := sha256.Sum256(img)
	digest := hex.EncodeToString(s[:])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/images/"+digest {
			w.Write(img)
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, digest
}

// deploy.image with an "os" section asks for the provisioned token and the
// user data first, writes the image, then the installed OS's files; a
// refused secret leaves the disk untouched.
func TestDeployConfiguresTheInstalledOS(t *testing.T) {
	img := bytes.Repeat([]byte{0x5a}, 2<<20)
	url, digest := imageServer(t, img)
	target := filepath.Join(t.TempDir(), "disk")
	os.WriteFile(target, make([]byte, 3<<20), 0o600)
	part := &fakePartition{dir: t.TempDir()}
	var asked []string
	secrets := map[string]string{"provisioned-token": "bcjt_x_y", "user-data": "#cloud-config\n"}
	c := Config{CacheURL: url, allowFiles: true, mount: part.mount,
		OS: OSFiles{ConfigTOML: []byte("gateway = \"https://gw\"\n"), JWK: []byte("{\"kty\":\"EC\"}\n")},
		secret: func(_ context.Context, name string) ([]byte, error) {
			asked = append(asked, name)
			if v, ok := secrets[name]; ok {
				return []byte(v), nil
			}
			return nil, errors.New("refused")
		}}
	dep := kind(t, Kinds(c), "deploy.image")
	out, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+digest+`","os":{"partition":1,"node_id":"web-01","user_data":"nocloud"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(asked, ",") != "provisioned-token,user-data" || part.mounted != 0 || part.ro[0] {
		t.Fatalf("asked %v, mounts left %d, read-only %v", asked, part.mounted, part.ro)
	}
	for p, want := range map[string]string{
		"etc/bcd/config.toml": "gateway = \"https://gw\"\n", "etc/bcd/join-token": "bcjt_x_y", "etc/bcd/node-id": "web-01\n",
		"etc/bcd/join-encryption.jwk": "{\"kty\":\"EC\"}\n", "var/lib/cloud/seed/nocloud/user-data": "#cloud-config\n",
	} {
		if b, err := os.ReadFile(filepath.Join(part.dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q %v, want %q", p, b, err, want)
		}
	}
	if !strings.Contains(string(out), `"/etc/bcd/join-token"`) || strings.Contains(string(out), "bcjt_x_y") {
		t.Errorf("result %s: must list the files and never the token", out)
	}

	// A refused secret: nothing is written to the disk.
	os.WriteFile(target, make([]byte, 3<<20), 0o600)
	delete(secrets, "user-data")
	if _, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+digest+`","os":{"partition":1,"node_id":"web-01","user_data":"nocloud"}}`)); err == nil || !strings.Contains(err.Error(), "user data") {
		t.Fatalf("refused user data: %v", err)
	}
	if b, _ := os.ReadFile(target); !allZero(b) {
		t.Error("the disk was written although a secret was refused")
	}

	// An installed OS that cannot be configured is left unbootable.
	part.dir = filepath.Join(t.TempDir(), "missing")
	if _, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+digest+`","os":{"partition":1}}`)); err == nil {
		t.Fatal("configuring a partition that does not open succeeded")
	}
	// (The image is 2 MiB: its first MiB and its last MiB written, a
	// backup GPT's place, are zeroed.)
	if b, _ := os.ReadFile(target); !allZero(b[:2<<20]) {
		t.Error("the image's first and last MiB were not zeroed after the OS could not be configured")
	}

	for _, body := range []string{
		`{"target":"` + target + `","sha256":"` + digest + `","os":{"partition":0}}`,
		`{"target":"` + target + `","sha256":"` + digest + `","os":{"partition":1,"user_data":"kickstart","node_id":"a"}}`,
		`{"target":"` + target + `","sha256":"` + digest + `","os":{"partition":1,"user_data":"nocloud"}}`,
		`{"target":"` + target + `","sha256":"` + digest + `","os":{"partition":1,"path":"/etc"}}`,
	} {
		if _, err := dep.Run(context.Background(), []byte(body)); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// boot.kexec reads an installed OS's kernel from its partition, mounted
// read-only; paths leaving the partition, or symlinks out of it, are
// refused.
func TestKexecFromDisk(t *testing.T) {
	part := &fakePartition{dir: t.TempDir()}
	os.MkdirAll(filepath.Join(part.dir, "boot"), 0o755)
	os.WriteFile(filepath.Join(part.dir, "boot/vmlinuz"), []byte("installed kernel"), 0o644)
	os.WriteFile(filepath.Join(part.dir, "boot/initrd"), []byte("installed initrd"), 0o644)
	secret := filepath.Join(t.TempDir(), "ramdisk-secret")
	os.WriteFile(secret, []byte("not for the image"), 0o600)
	os.Symlink(secret, filepath.Join(part.dir, "boot/escape"))
	disk := filepath.Join(t.TempDir(), "disk")
	os.WriteFile(disk, nil, 0o600)
	var loaded string
	c := Config{allowFiles: true, mount: part.mount, kexecLoader: func(k, i []byte, cmdline string) error {
		loaded = string(k) + "|" + string(i) + "|" + cmdline
		return nil
	}}
	k := kind(t, Kinds(c), "boot.kexec")
	res, err := k.Resources([]byte(`{"disk":"` + disk + `","partition":1,"kernel":"boot/vmlinuz","cmdline":""}`))
	if err != nil || len(res) != 2 || res[1] != "disk:"+disk {
		t.Fatalf("resources %v %v", res, err)
	}
	if _, err := k.Run(context.Background(), []byte(`{"disk":"`+disk+`","partition":1,"kernel":"/boot/vmlinuz","initrd":"boot/initrd","cmdline":"root=/dev/vda1"}`)); err != nil {
		t.Fatal(err)
	}
	if loaded != "installed kernel|installed initrd|root=/dev/vda1" || part.mounted != 0 || !part.ro[0] {
		t.Fatalf("loaded %q, mounts left %d, read-only %v", loaded, part.mounted, part.ro)
	}
	for body, want := range map[string]string{
		`{"disk":"` + disk + `","partition":1,"kernel":"../etc/shadow","cmdline":""}`:              "not a path inside",
		`{"disk":"` + disk + `","partition":1,"kernel":"boot/escape","cmdline":""}`:                "kernel",
		`{"disk":"` + disk + `","partition":2,"kernel":"boot/vmlinuz","cmdline":""}`:               "no such partition",
		`{"disk":"` + disk + `","kernel_sha256":"` + strings.Repeat("a", 64) + `","cmdline":""}`:   "not both",
		`{"kernel":"boot/vmlinuz","kernel_sha256":"` + strings.Repeat("a", 64) + `","cmdline":""}`: "go with",
	} {
		loaded = ""
		if _, err := k.Run(context.Background(), []byte(body)); err == nil || !strings.Contains(err.Error(), want) || loaded != "" {
			t.Errorf("%s: %v (loaded %q), want an error with %q", body, err, loaded, want)
		}
	}
}

// fakeSession stands in for the agent's session in a kind's context: it
// records progress reports.
type fakeSession struct{ progress []string }

func (f *fakeSession) Secret(context.Context, string, string, string) ([]byte, error) {
	return nil, errors.New("no secrets here")
}
func (f *fakeSession) Progress(id string, detail []byte) {
	f.progress = append(f.progress, id+" "+string(detail))
}

// deploy.image and disk.wipe report their progress through the session.
func TestProgressIsReported(t *testing.T) {
	img := bytes.Repeat([]byte{1}, 3<<20)
	url, digest := imageServer(t, img)
	target := filepath.Join(t.TempDir(), "disk")
	os.WriteFile(target, make([]byte, 4<<20), 0o600)
	s := &fakeSession{}
	ctx := session.WithSecrets(dispatch.WithCommandID(context.Background(), "cmd_1"), s)
	ks := Kinds(Config{CacheURL: url, allowFiles: true})
	if _, err := kind(t, ks, "deploy.image").Run(ctx, []byte(`{"target":"`+target+`","sha256":"`+digest+`"}`)); err != nil {
		t.Fatal(err)
	}
	last := s.progress[len(s.progress)-1]
	if !strings.HasPrefix(last, `cmd_1 {`) || !strings.Contains(last, `"done":true`) || !strings.Contains(last, `"written":3145728`) {
		t.Fatalf("progress %q", s.progress)
	}
}
