package filetable

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestResolveAndLookup(t *testing.T) {
	tests := []struct {
		kind, id string
		path     string
		mode     fs.FileMode
	}{
		{"cdi", "gpu0_hold-1", "/etc/cdi/bcd-gpu0_hold-1.json", 0o644},
		{"cdi", strings.Repeat("a", 128), "/etc/cdi/bcd-" + strings.Repeat("a", 128) + ".json", 0o644},
		{"allocation-env", "alloc-7", "/run/bcd-alloc/alloc-7.env", 0o644},
		{"ssh-dropin", "", "/etc/ssh/sshd_config.d/10-better-compute.conf", 0o644},
		{"ssh-ca", "", "/etc/ssh/bc_ca.pub", 0o644},
		{"ssh-krl", "", "/etc/ssh/bc_krl", 0o644},
		{"ssh-principals", "alice@example.com", "/etc/ssh/bc_principals/alice@example.com", 0o644},
		{"ssh-principals", "a.b", "/etc/ssh/bc_principals/a.b", 0o644},
		{"k8s-token", "", "/var/lib/bcd-hostconfig/k8s/bootstrap-token", 0o600},
	}
	for _, tt := range tests {
		got, err := Resolve(tt.kind, tt.id)
		if err != nil {
			t.Errorf("Resolve(%q, %q): %v", tt.kind, tt.id, err)
			continue
		}
		if got.Path() != tt.path || got.Mode != tt.mode {
			t.Errorf("Resolve(%q, %q) = %s %o, want %s %o", tt.kind, tt.id, got.Path(), got.Mode, tt.path, tt.mode)
		}
		back, err := Lookup(tt.path)
		if err != nil {
			t.Errorf("Lookup(%q): %v", tt.path, err)
			continue
		}
		if back.Kind != tt.kind || back.ID != tt.id {
			t.Errorf("Lookup(%q) = %s %q, want %s %q", tt.path, back.Kind, back.ID, tt.kind, tt.id)
		}
	}
}

func TestResolveRefuses(t *testing.T) {
	tests := []struct{ kind, id string }{
		{"passwd", ""},
		{"", ""},
		{"CDI", "x"},
		{"cdi", ""},
		{"cdi", "../../etc/passwd"},
		{"cdi", "a/b"},
		{"cdi", "a.b"},
		{"cdi", strings.Repeat("a", 129)},
		{"cdi", "a\x00"},
		{"cdi", "é"},
		{"allocation-env", "x y"},
		{"ssh-ca", "x"},
		{"k8s-token", "x"},
		{"ssh-principals", "."},
		{"ssh-principals", ".."},
		{"ssh-principals", "a/b"},
		{"ssh-principals", strings.Repeat("a", 65)},
	}
	for _, tt := range tests {
		if got, err := Resolve(tt.kind, tt.id); !errors.Is(err, ErrNotInTable) {
			t.Errorf("Resolve(%q, %q) = %+v, %v; want ErrNotInTable", tt.kind, tt.id, got, err)
		}
	}
}

func TestLookupRefuses(t *testing.T) {
	for _, p := range []string{
		"/etc/passwd",
		"",
		"etc/cdi/bcd-x.json",
		"/etc/cdi/../cdi/bcd-x.json",
		"/etc/cdi//bcd-x.json",
		"/etc/cdi/bcd-x.json/",
		"/etc/cdi/bcd-.json",
		"/etc/cdi/x.json",
		"/etc/cdi/bcd-x.yaml",
		"/etc/cdi/sub/bcd-x.json",
		"/etc/ssh/bc_principals/..",
		"/etc/ssh/bc_principals/",
		"/etc/ssh/sshd_config",
		"/etc/ssh/sshd_config.d/other.conf",
		"/run/bcd-alloc/.env",
		"/run/bcd/allocations/a1.env", // the old path, under the node's /run/bcd
		"/run/bcd-alloc/sub/a1.env",
		"/var/lib/bcd-hostconfig/k8s/bootstrap-token2",
	} {
		if got, err := Lookup(p); !errors.Is(err, ErrNotInTable) {
			t.Errorf("Lookup(%q) = %+v, %v; want ErrNotInTable", p, got, err)
		}
	}
}

func TestKinds(t *testing.T) {
	got := strings.Join(Kinds(), " ")
	want := "cdi allocation-env ssh-dropin ssh-ca ssh-krl ssh-principals k8s-token"
	if got != want {
		t.Errorf("Kinds() = %s, want %s", got, want)
	}
}

// TestNoKindInTheNodesDirectories: no kind lives in a directory the node
// account owns on an unprivileged install (/run/bcd for its status socket,
// /var/lib/bcd for its data), since the helper refuses to write in a
// directory that is not root's alone.
func TestNoKindInTheNodesDirectories(t *testing.T) {
	for _, k := range Kinds() {
		id := ""
		if _, err := Resolve(k, ""); err != nil {
			id = "x"
		}
		tg, err := Resolve(k, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, nodes := range []string{"/run/bcd", "/var/lib/bcd"} {
			if tg.Dir == nodes || strings.HasPrefix(tg.Dir, nodes+"/") {
				t.Errorf("kind %s lives in %s, which is under the node's %s", k, tg.Dir, nodes)
			}
		}
	}
}

func TestCheckK8sToken(t *testing.T) {
	for _, ok := range []string{"abcdef.0123456789abcdef", "abcdef.0123456789abcdef\n", "07401b.f395accd246ae52d"} {
		if err := CheckK8sToken([]byte(ok)); err != nil {
			t.Errorf("CheckK8sToken(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{
		"", "\n", "t", "evil",
		"abcdef.0123456789abcdef\n\n",       // two newlines
		"abcdef.0123456789abcdef\nrm -rf /", // a second line
		"ABCDEF.0123456789abcdef",           // kubeadm's form is lower case
		"abcdef:0123456789abcdef",
		"abcdefg.0123456789abcde",
		"abcdef.0123456789abcdef ",
		" abcdef.0123456789abcdef",
		"abcdef.0123456789abcdef\r\n",
		"abcdef.0123456789abcde\x00",
	} {
		err := CheckK8sToken([]byte(bad))
		if err == nil {
			t.Errorf("CheckK8sToken(%q) accepted", bad)
			continue
		}
		if len(bad) > 4 && strings.Contains(err.Error(), bad) {
			t.Errorf("the error quotes the content: %v", err)
		}
	}
}

// FuzzCheckK8sToken: what the check accepts is exactly the kubeadm form
// (six and sixteen of [a-z0-9] around a '.', at most one newline after).
func FuzzCheckK8sToken(f *testing.F) {
	for _, s := range []string{"abcdef.0123456789abcdef", "abcdef.0123456789abcdef\n", "x", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if CheckK8sToken(b) != nil {
			return
		}
		s := strings.TrimSuffix(string(b), "\n")
		if len(s) != 23 || s[6] != '.' || strings.Trim(s[:6]+s[7:], "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
			t.Fatalf("accepted %q", b)
		}
	})
}
