package ramdiskkinds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/better-compute/bcd/components/agent/dispatch"
)

func kind(t *testing.T, ks []dispatch.Kind, name string) dispatch.Kind {
	t.Helper()
	for _, k := range ks {
		if k.Name == name {
			return k
		}
	}
	t.Fatalf("no kind %s", name)
	return dispatch.Kind{}
}

func TestDeployFromTheSiteCache(t *testing.T) {
	raw := bytes.Repeat([]byte("an installed OS "), 40000)
	var z bytes.Buffer
	enc, _ := zstd.NewWriter(&z)
	enc.Write(raw)
	enc.Close()
	sum := sha256.Sum256(z.Bytes())
	digest := hex.EncodeToString(sum[:])
	hits := 0
	cache := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/images/"+digest {
			hits++
			w.Write(z.Bytes())
			return
		}
		http.NotFound(w, r)
	}))
	defer cache.Close()
	target := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(target, make([]byte, len(raw)+4096), 0o600); err != nil {
		t.Fatal(err)
	}
	ks := Kinds(Config{CacheURL: cache.URL, allowFiles: true})
	dep := kind(t, ks, "deploy.image")
	if _, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+digest+`"}`)); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(target)
	if hits != 1 || !bytes.Equal(got[:len(raw)], raw) {
		t.Fatalf("cache hits %d, image on disk matches %v", hits, bytes.Equal(got[:len(raw)], raw))
	}
	// A wrong digest fails and leaves the target unbootable (first MiB zero).
	bad := strings.Repeat("0", 64)
	if _, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+bad+`","url":"http://x"}`)); err == nil || !strings.Contains(err.Error(), "https") {
		t.Fatalf("http source accepted: %v", err)
	}
	if _, err := dep.Run(context.Background(), []byte(`{"target":"`+target+`","sha256":"`+bad+`"}`)); err == nil {
		t.Fatal("a missing image deployed")
	}
	// Refusals: unknown field, a target that is not a disk.
	strictKinds := Kinds(Config{CacheURL: cache.URL})
	for _, body := range []string{
		`{"target":"` + target + `","sha256":"` + digest + `","force":true}`,
		`{"target":"` + target + `","sha256":"` + digest + `"}`,
		`{"target":"/dev/../etc/passwd","sha256":"` + digest + `"}`,
	} {
		if _, err := kind(t, strictKinds, "deploy.image").Run(context.Background(), []byte(body)); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
	if _, err := kind(t, strictKinds, "disk.wipe").Run(context.Background(), []byte(`{"devices":["`+target+`"],"mode":"quick"}`)); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("wipe of a regular file: %v", err)
	}
	if _, err := kind(t, strictKinds, "disk.wipe").Run(context.Background(), []byte(`{"devices":["/dev/null"],"mode":"scrub"}`)); err == nil {
		t.Error("unknown mode accepted")
	}
}

func TestKexecLoadsVerifiedImagesAndRebootsAfterAck(t *testing.T) {
	kernel, initrd := []byte("a kernel"), []byte("an initramfs")
	d := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	cache := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/images/" + d(kernel):
			w.Write(kernel)
		case "/images/" + d(initrd):
			w.Write(initrd)
		case "/images/" + d([]byte("liar")):
			w.Write([]byte("not the liar"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer cache.Close()
	var loaded string
	rebooted := 0
	c := Config{CacheURL: cache.URL,
		kexecLoader: func(k, i []byte, cmdline string) error {
			loaded = string(k) + "|" + string(i) + "|" + cmdline
			return nil
		},
		rebootNow: func() error { rebooted++; return nil }}
	k := kind(t, Kinds(c), "boot.kexec")
	if k.AfterAck == nil {
		t.Fatal("boot.kexec must reboot only after its result is acked")
	}
	if _, err := k.Run(context.Background(), []byte(`{"kernel_sha256":"`+d(kernel)+`","initrd_sha256":"`+d(initrd)+`","cmdline":"console=ttyS0"}`)); err != nil {
		t.Fatal(err)
	}
	if loaded != "a kernel|an initramfs|console=ttyS0" || rebooted != 0 {
		t.Fatalf("loaded %q, rebooted %d", loaded, rebooted)
	}
	k.AfterAck("x")
	if rebooted != 1 {
		t.Fatal("no reboot after the ack")
	}
	if _, err := k.Run(context.Background(), []byte(`{"kernel_sha256":"`+d([]byte("liar"))+`","cmdline":""}`)); err == nil || !strings.Contains(err.Error(), "another digest") {
		t.Fatalf("a kernel with another digest: %v", err)
	}
}
