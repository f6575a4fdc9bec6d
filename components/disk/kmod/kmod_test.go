package kmod

import (
	"bytes"
	"github.com/better-compute/bcd/components/base/testenv"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// The virtio + e1000 + NVMe slice of Debian 6.1's modules.dep, softdeps
// and aliases, as the ramdisk uses it.
const debianDep = `kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko: kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/net/core/failover.ko:
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/ethernet/intel/e1000/e1000.ko:
kernel/crypto/crct10dif_common.ko:
kernel/crypto/crct10dif_generic.ko: kernel/crypto/crct10dif_common.ko
kernel/arch/x86/crypto/crct10dif-pclmul.ko: kernel/crypto/crct10dif_common.ko
kernel/lib/crc64.ko:
kernel/lib/crc64-rocksoft.ko: kernel/lib/crc64.ko
kernel/lib/crc-t10dif.ko: kernel/crypto/crct10dif_common.ko
kernel/block/t10-pi.ko: kernel/lib/crc64-rocksoft.ko kernel/lib/crc-t10dif.ko kernel/lib/crc64.ko kernel/crypto/crct10dif_common.ko
kernel/drivers/nvme/host/nvme-core.ko: kernel/block/t10-pi.ko kernel/lib/crc64-rocksoft.ko kernel/lib/crc-t10dif.ko kernel/lib/crc64.ko kernel/crypto/crct10dif_common.ko
kernel/drivers/nvme/host/nvme.ko: kernel/drivers/nvme/host/nvme-core.ko kernel/block/t10-pi.ko kernel/lib/crc64-rocksoft.ko kernel/lib/crc-t10dif.ko kernel/lib/crc64.ko kernel/crypto/crct10dif_common.ko
`

const debianSoftdep = `# Soft dependencies extracted from modules themselves.
softdep crc_t10dif pre: crct10dif
softdep crc64_rocksoft pre: crc64
`

const debianAlias = `# Aliases extracted from modules themselves.
alias crypto-crct10dif crct10dif_pclmul
alias crct10dif crct10dif_pclmul
alias cpu:type:x86,ven*fam*mod*:feature:*0081* crct10dif_pclmul
alias crct10dif crct10dif_generic
alias pci:v00008086d0000100Esv*sd*bc*sc*i* e1000
`

const debianBuiltin = `kernel/drivers/char/tpm/tpm.ko
kernel/drivers/char/tpm/tpm_tis.ko
kernel/drivers/char/tpm/tpm_crb.ko
`

func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func debianTree(t *testing.T) string {
	return tree(t, map[string]string{
		"modules.dep": debianDep, "modules.softdep": debianSoftdep,
		"modules.alias": debianAlias, "modules.builtin": debianBuiltin,
	})
}

// checkOrder fails when a module comes before one of its hard
// dependencies.
func checkOrder(t *testing.T, p Plan) {
	t.Helper()
	pos := map[string]int{}
	for i, m := range p.Modules {
		if _, dup := pos[m.Name]; dup {
			t.Errorf("%s planned twice", m.Name)
		}
		pos[m.Name] = i
	}
	for _, m := range p.Modules {
		for _, d := range m.Deps {
			if pd, ok := pos[d]; !ok || pd > pos[m.Name] {
				t.Errorf("%s (at %d) before its dependency %s (at %d, planned %v)", m.Name, pos[m.Name], d, pd, ok)
			}
		}
	}
}

func TestResolve(t *testing.T) {
	ix, err := ReadIndex(debianTree(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		names   []string
		want    []string
		soft    []string
		builtin []string
	}{
		{
			names: []string{"virtio_pci"},
			want:  []string{"virtio", "virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci"},
		},
		{
			names: []string{"virtio_net", "virtio_blk"},
			want:  []string{"virtio", "virtio_ring", "failover", "net_failover", "virtio_net", "virtio_blk"},
		},
		{
			names: []string{"e1000", "e1000"},
			want:  []string{"e1000"},
		},
		{
			// crc_t10dif's softdep names the crct10dif alias, which two
			// modules provide; both come first, softly.
			names: []string{"nvme"},
			want: []string{"crct10dif_common", "crc64", "crct10dif_pclmul", "crct10dif_generic", "crc_t10dif",
				"crc64_rocksoft", "t10_pi", "nvme_core", "nvme"},
			soft: []string{"crct10dif_pclmul", "crct10dif_generic"},
		},
		{
			// Dashes and underscores are one name; builtins load nothing.
			names:   []string{"nvme-core", "tpm_tis", "tpm-crb"},
			want:    []string{"crct10dif_common", "crc64", "crct10dif_pclmul", "crct10dif_generic", "crc_t10dif", "crc64_rocksoft", "t10_pi", "nvme_core"},
			soft:    []string{"crct10dif_pclmul", "crct10dif_generic"},
			builtin: []string{"tpm_tis", "tpm_crb"},
		},
		{
			// An alias asked for by name is hard, and so are its modules.
			names: []string{"crct10dif", "crc_t10dif"},
			want:  []string{"crct10dif_common", "crct10dif_pclmul", "crct10dif_generic", "crc_t10dif"},
		},
	} {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			p, err := ix.Resolve(tc.names...)
			if err != nil {
				t.Fatal(err)
			}
			checkOrder(t, p)
			if got := p.Names(); !slices.Equal(got, tc.want) {
				t.Errorf("order\n got %v\nwant %v", got, tc.want)
			}
			var soft []string
			for _, m := range p.Modules {
				if m.Soft {
					soft = append(soft, m.Name)
				}
			}
			if !slices.Equal(soft, tc.soft) {
				t.Errorf("soft %v, want %v", soft, tc.soft)
			}
			if !slices.Equal(p.Builtin, tc.builtin) {
				t.Errorf("builtin %v, want %v", p.Builtin, tc.builtin)
			}
		})
	}
}

func TestResolveRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		ask   []string
		want  string
	}{
		{
			name:  "unknown module",
			files: map[string]string{"modules.dep": debianDep},
			ask:   []string{"nosuch"},
			want:  "kmod: module nosuch: not in",
		},
		{
			name:  "hard cycle",
			files: map[string]string{"modules.dep": "a.ko: b.ko\nb.ko: c.ko\nc.ko: a.ko\n"},
			ask:   []string{"a"},
			want:  "kmod: dependency cycle: a -> b -> c -> a",
		},
		{
			name:  "softdep cycle",
			files: map[string]string{"modules.dep": "a.ko:\nb.ko:\n", "modules.softdep": "softdep a pre: b\nsoftdep b pre: a\n"},
			ask:   []string{"a"},
			want:  "kmod: dependency cycle: a -> b -> a",
		},
		{
			name:  "self softdep",
			files: map[string]string{"modules.dep": "a.ko:\n", "modules.softdep": "softdep a pre: a\n"},
			ask:   []string{"a"},
			want:  "kmod: dependency cycle: a -> a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := ReadIndex(tree(t, tc.files))
			if err != nil {
				t.Fatal(err)
			}
			_, err = ix.Resolve(tc.ask...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Resolve(%v) = %v, want %q", tc.ask, err, tc.want)
			}
		})
	}
}

func TestReadIndexRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"no modules.dep", map[string]string{}, "modules.dep: no such file"},
		{"dangling dependency", map[string]string{"modules.dep": "a.ko: b.ko\n"}, "a depends on b, which has no line of its own"},
		{"garbage", map[string]string{"modules.dep": "hello\n"}, "line 1: not"},
		{"listed twice", map[string]string{"modules.dep": "x/a.ko:\ny/a.ko:\n"}, "module a listed twice"},
		{"softdep without a module", map[string]string{"modules.dep": "a.ko:\n", "modules.softdep": "softdep\n"}, "line 1: not"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadIndex(tree(t, tc.files))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadIndex = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPostSoftdepAndMissing(t *testing.T) {
	ix, err := ReadIndex(tree(t, map[string]string{
		"modules.dep":     "a.ko:\nb.ko: a.ko\nc.ko:\n",
		"modules.softdep": "softdep a post: c\nsoftdep b pre: nosuch\n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := ix.Resolve("b")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Names(), []string{"a", "c", "b"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if !slices.Equal(p.Missing, []string{"nosuch"}) {
		t.Errorf("missing %v", p.Missing)
	}
}

// TestWriteSubset: the subset index an image carries resolves the same
// plan as the full one.
func TestWriteSubset(t *testing.T) {
	ix, err := ReadIndex(debianTree(t))
	if err != nil {
		t.Fatal(err)
	}
	ask := []string{"virtio_pci", "virtio_net", "nvme", "e1000", "tpm_tis"}
	full, err := ix.Resolve(ask...)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ix.WriteSubset(dir, full); err != nil {
		t.Fatal(err)
	}
	sub, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := sub.Resolve(ask...)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(full.Names(), again.Names()) || !slices.Equal(full.Builtin, again.Builtin) {
		t.Errorf("subset plan\n %v %v\nfull\n %v %v", again.Names(), again.Builtin, full.Names(), full.Builtin)
	}
	if _, ok := sub.Path("virtio_blk"); ok {
		t.Error("the subset lists virtio_blk, which was not asked for")
	}
}

type call struct {
	name   string
	flags  int
	params string
	image  []byte
}

func fakeLoader(t *testing.T, dir string, fail map[string]error) (*Loader, *[]call) {
	var calls []call
	l := &Loader{Root: filepath.Dir(dir), Release: filepath.Base(dir)}
	l.FinitModule = func(fd int, params string, flags int) error {
		p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		if err != nil {
			t.Fatal(err)
		}
		n := Canonical(p)
		calls = append(calls, call{name: n, flags: flags, params: params})
		return fail[n]
	}
	l.InitModule = func(image []byte, params string) error {
		n := Canonical(strings.TrimSpace(string(image)))
		calls = append(calls, call{name: n, params: params, image: image})
		return fail[n]
	}
	return l, &calls
}

func TestLoaderOrderAndFailures(t *testing.T) {
	if runtime.GOOS != "linux" {
		testenv.NotApplicable(t, "reads /proc/self/fd, which only Linux has")
	}
	files := map[string]string{"modules.dep": debianDep, "modules.softdep": debianSoftdep, "modules.alias": debianAlias}
	for _, line := range strings.Split(strings.TrimSpace(debianDep), "\n") {
		p, _, _ := strings.Cut(line, ":")
		files[p] = "module " + p
	}
	root := tree(t, files)
	l, calls := fakeLoader(t, root, map[string]error{
		"virtio_ring":      syscall.EEXIST,  // already loaded: fine
		"crct10dif_pclmul": syscall.ENODEV,  // soft: no PCLMUL, fine
		"failover":         syscall.ENOEXEC, // hard: net_failover and virtio_net are skipped
	})
	l.Params = map[string]string{"nvme": "poll_queues=1"}
	rs, err := l.Load("virtio_pci", "virtio_net", "nvme")
	if err == nil {
		t.Fatal("Load succeeded with failover failing")
	}
	for _, want := range []string{"finit_module(", "failover.ko", `"", 0) = exec format error`, "kmod: net_failover: dependency failover failed", "kmod: virtio_net: dependency"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "pclmul") {
		t.Errorf("a soft module's failure is in the error: %v", err)
	}
	states := map[string]State{}
	for _, r := range rs {
		states[r.Name] = r.State
	}
	for name, want := range map[string]State{
		"virtio": Loaded, "virtio_ring": AlreadyLoaded, "virtio_pci": Loaded, "failover": Failed,
		"net_failover": Skipped, "virtio_net": Skipped, "crct10dif_pclmul": Failed, "nvme": Loaded,
	} {
		if states[name] != want {
			t.Errorf("%s: %s, want %s", name, states[name], want)
		}
	}
	var order []string
	for _, c := range *calls {
		order = append(order, c.name)
		if c.name == "nvme" && c.params != "poll_queues=1" {
			t.Errorf("nvme params %q", c.params)
		}
	}
	for _, skipped := range []string{"net_failover", "virtio_net"} {
		if slices.Contains(order, skipped) {
			t.Errorf("%s was loaded after its dependency failed", skipped)
		}
	}
	if i, j := slices.Index(order, "nvme_core"), slices.Index(order, "nvme"); i < 0 || j < i {
		t.Errorf("load order %v", order)
	}
}

func TestLoaderCompressed(t *testing.T) {
	if runtime.GOOS != "linux" {
		testenv.NotApplicable(t, "reads /proc/self/fd, which only Linux has")
	}
	var zb, gb bytes.Buffer
	zw, _ := zstd.NewWriter(&zb)
	zw.Write([]byte("module kernel/a.ko.zst"))
	zw.Close()
	gw := gzip.NewWriter(&gb)
	gw.Write([]byte("module kernel/b.ko.gz"))
	gw.Close()
	root := tree(t, map[string]string{
		"modules.dep":     "kernel/a.ko.zst:\nkernel/b.ko.gz: kernel/a.ko.zst\nkernel/c.ko.xz: kernel/b.ko.gz\n",
		"kernel/a.ko.zst": zb.String(), "kernel/b.ko.gz": gb.String(), "kernel/c.ko.xz": "xz bytes",
	})
	l, calls := fakeLoader(t, root, nil)
	if _, err := l.Load("c"); err != nil {
		t.Fatal(err)
	}
	want := []call{
		{name: "a", image: []byte("module kernel/a.ko.zst")},
		{name: "b", image: []byte("module kernel/b.ko.gz")},
		{name: "c", flags: unix.MODULE_INIT_COMPRESSED_FILE},
	}
	if len(*calls) != len(want) {
		t.Fatalf("calls %+v", *calls)
	}
	for i, c := range *calls {
		if c.name != want[i].name || c.flags != want[i].flags || !bytes.Equal(c.image, want[i].image) {
			t.Errorf("call %d: %+v, want %+v", i, c, want[i])
		}
	}

	// A corrupt compressed module fails with the file named.
	os.WriteFile(filepath.Join(root, "kernel/a.ko.zst"), []byte("not zstd"), 0o644)
	_, err := l.Load("a")
	if err == nil || !strings.Contains(err.Error(), "a.ko.zst") {
		t.Errorf("corrupt zstd module: %v", err)
	}
}

// TestRealTree resolves the ramdisk's modules against the installed
// kernel's tree, when there is one.
func TestRealTree(t *testing.T) {
	matches, _ := filepath.Glob("/lib/modules/*/modules.dep")
	if len(matches) == 0 {
		testenv.Skip(t, "no /lib/modules/*/modules.dep on this machine (apt-get install linux-image-amd64; build/deps.sh does)")
	}
	for _, m := range matches {
		ix, err := ReadIndex(filepath.Dir(m))
		if err != nil {
			t.Fatal(err)
		}
		var ask []string
		for _, n := range []string{"virtio_pci", "virtio_blk", "virtio_net", "e1000", "nvme"} {
			if _, ok := ix.Path(n); ok || ix.Builtin(n) {
				ask = append(ask, n)
			}
		}
		p, err := ix.Resolve(ask...)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Dir(m), err)
		}
		checkOrder(t, p)
		t.Logf("%s: %v (builtin %v, missing softdeps %v)", filepath.Base(filepath.Dir(m)), p.Names(), p.Builtin, p.Missing)
	}
}

// TestMatch: device aliases match a modalias as fnmatch globs, and the
// subset written for an image keeps those of its modules.
func TestMatch(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("modules.dep", "kernel/e1000e.ko:\nkernel/ahci.ko: kernel/libahci.ko\nkernel/libahci.ko:\nkernel/igb.ko:\n")
	write("modules.alias", "alias pci:v00008086d000010D3sv*sd*bc*sc*i* e1000e\n"+
		"alias pci:v*d*sv*sd*bc01sc06i01* ahci\nalias pci:v00008086d000010C9sv*sd*bc*sc*i* igb\nalias pci:v0000[ab* igb\nalias crc32 crc32_generic\n")
	ix, err := ReadIndex(dir)
	if err != nil {
		t.Fatal(err)
	}
	for modalias, want := range map[string]string{
		"pci:v00008086d000010D3sv00008086sd00000000bc02sc00i00": "e1000e",
		"pci:v00008086d00002922sv00001AF4sd00001100bc01sc06i01": "ahci",
		"pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00": "",
		"virtio:d00000001v00001AF4":                             "",
	} {
		if got := strings.Join(ix.Match(modalias), " "); got != want {
			t.Errorf("Match(%s) = %q, want %q", modalias, got, want)
		}
	}
	plan, err := ix.Resolve("ahci")
	if err != nil {
		t.Fatal(err)
	}
	sub := t.TempDir()
	if err := ix.WriteSubset(sub, plan); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(sub, "modules.alias"))
	if string(b) != "alias pci:v*d*sv*sd*bc01sc06i01* ahci\n" {
		t.Errorf("subset aliases %q", b)
	}
}
