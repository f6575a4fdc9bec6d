package logbundle

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func static(name, content string) Source {
	return Source{Name: name, Read: func(context.Context) ([]byte, error) { return []byte(content), nil }}
}

func failing(name, content string, err error) Source {
	return Source{Name: name, Read: func(context.Context) ([]byte, error) { return []byte(content), err }}
}

// untar reads a bundle back: its files by name, in order.
func untar(t *testing.T, b []byte) (map[string]string, []string) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	files := map[string]string{}
	var order []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Mode != 0o600 || hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s: mode %o type %c", hdr.Name, hdr.Mode, hdr.Typeflag)
		}
		files[hdr.Name] = string(data)
		order = append(order, hdr.Name)
	}
	return files, order
}

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfg, []byte("gateway = \"https://gw.example:443\"\njoin_token = \"bcjt_jt_01_secret\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sources := []Source{
		FileSource("config.toml", cfg),
		FileSource("identity.json", filepath.Join(dir, "missing.json")),
		static("logs/bcd.txt", "line 1\nAuthorization: Bearer abcdef\n-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\nline 5\n"),
		failing("partial.txt", "some output password=x\n", errors.New("exit status 1: token=leaked")),
		failing("empty.txt", "", errors.New("boom")),
		static("../escape", "x"),
		static("logs/bcd.txt", "duplicate"),
		static(ManifestName, "forged"),
		CommandSource("missing-cmd.txt", []string{"bcd-no-such-binary-xyz"}, 0),
	}
	var buf bytes.Buffer
	m, err := Build(context.Background(), sources, &buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	files, order := untar(t, buf.Bytes())
	wantFiles := map[string]string{
		"config.toml":  "gateway = \"https://gw.example:443\"\njoin_token = \"[REDACTED]\"\n",
		"logs/bcd.txt": "line 1\nAuthorization: Bearer [REDACTED]\n[REDACTED]\nline 5\n",
		"partial.txt":  "some output password=[REDACTED]\n",
	}
	for name, want := range wantFiles {
		if files[name] != want {
			t.Errorf("%s = %q, want %q", name, files[name], want)
		}
	}
	if len(order) != len(wantFiles)+1 || order[len(order)-1] != ManifestName {
		t.Errorf("bundle files %v, want the %d stored sources then %s", order, len(wantFiles), ManifestName)
	}

	var onDisk Manifest
	if err := json.Unmarshal([]byte(files[ManifestName]), &onDisk); err != nil {
		t.Fatal(err)
	}
	if len(onDisk.Files) != len(sources) || len(m.Files) != len(sources) {
		t.Fatalf("manifest lists %d files (returned %d), want %d", len(onDisk.Files), len(m.Files), len(sources))
	}
	wantErr := []string{"", "no such file", "", "exit status 1: token=[REDACTED]", "boom", "invalid file name", "already named", "reserved for the manifest", "executable file not found"}
	for i, e := range onDisk.Files {
		if e != m.Files[i] {
			t.Errorf("entry %d: manifest.json %+v, returned %+v", i, e, m.Files[i])
		}
		if (wantErr[i] == "") != (e.Error == "") || !strings.Contains(e.Error, wantErr[i]) {
			t.Errorf("entry %d (%s): error %q, want %q", i, e.Name, e.Error, wantErr[i])
		}
		content, stored := files[e.Name]
		if e.Name == ManifestName || e.Name == "logs/bcd.txt" && i == 6 {
			stored = false
		}
		if !stored {
			if e.Size != 0 || e.SHA256 != "" {
				t.Errorf("entry %d (%s) not stored but has size %d sha %q", i, e.Name, e.Size, e.SHA256)
			}
			continue
		}
		sum := sha256.Sum256([]byte(content))
		if e.Size != int64(len(content)) || e.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("entry %d (%s): size %d sha %s, stored %d bytes with sha %x", i, e.Name, e.Size, e.SHA256, len(content), sum)
		}
	}
	if strings.Contains(buf.String(), "secret") {
		t.Error("bundle holds an unredacted secret")
	}
}

func TestBuildCap(t *testing.T) {
	log := strings.Repeat("0123456789abcdefghijklmnopqrstuvwxyz-line\n", 100) // 4200 bytes
	tail := Source{Name: "journal.txt", Read: static("", log).Read, Tail: true}
	tests := []struct {
		name     string
		sources  []Source
		maxBytes int64
		check    func(t *testing.T, files map[string]string, m Manifest)
	}{
		{
			name:     "fits",
			sources:  []Source{static("a.txt", log)},
			maxBytes: 4200,
			check: func(t *testing.T, files map[string]string, m Manifest) {
				if files["a.txt"] != log || m.Files[0].Truncated {
					t.Errorf("a.txt truncated: %+v", m.Files[0])
				}
			},
		},
		{
			name:     "head kept",
			sources:  []Source{static("a.txt", log), static("b.txt", strings.Repeat("b", 200))},
			maxBytes: 1000,
			check: func(t *testing.T, files map[string]string, m Manifest) {
				a := files["a.txt"]
				if len(a) > 1000 || !strings.HasPrefix(a, log[:800]) || !strings.HasSuffix(a, "bytes]\n") || !strings.Contains(a, "size cap dropped") {
					t.Errorf("a.txt (%d bytes) = ...%q", len(a), a[max(len(a)-120, 0):])
				}
				if e := m.Files[0]; !e.Truncated || e.OriginalSize != 4200 || e.Size != int64(len(a)) {
					t.Errorf("a.txt entry %+v", e)
				}
				// b.txt gets what the cut at a line break left.
				if e := m.Files[1]; !e.Truncated || e.Size != int64(len(files["b.txt"])) || e.Size >= 200 {
					t.Errorf("b.txt entry %+v, content %q", e, files["b.txt"])
				}
			},
		},
		{
			name:     "tail kept",
			sources:  []Source{tail},
			maxBytes: 1000,
			check: func(t *testing.T, files map[string]string, m Manifest) {
				j := files["journal.txt"]
				if len(j) > 1000 || !strings.HasSuffix(j, log[len(log)-800:]) || !strings.HasPrefix(j, "[bcd: the bundle's size cap dropped") {
					t.Errorf("journal.txt (%d bytes) = %q...", len(j), j[:min(len(j), 120)])
				}
				if _, rest, _ := strings.Cut(j, "\n"); !strings.HasPrefix(rest, "0123") {
					t.Errorf("journal.txt does not start at a line: %q", rest[:20])
				}
			},
		},
		{
			name:     "no room for a note",
			sources:  []Source{static("a.txt", log)},
			maxBytes: 10,
			check: func(t *testing.T, files map[string]string, m Manifest) {
				if files["a.txt"] != log[:10] || !m.Files[0].Truncated {
					t.Errorf("a.txt = %q, entry %+v", files["a.txt"], m.Files[0])
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			m, err := Build(context.Background(), tt.sources, &buf, tt.maxBytes)
			if err != nil {
				t.Fatal(err)
			}
			files, _ := untar(t, buf.Bytes())
			var total int64
			for _, e := range m.Files {
				total += e.Size
			}
			if total > tt.maxBytes {
				t.Errorf("stored %d bytes, cap %d", total, tt.maxBytes)
			}
			tt.check(t, files, m)
		})
	}
}

func TestTruncate(t *testing.T) {
	data := []byte("aaaa\nbbbb\ncccc\n")
	for _, tt := range []struct {
		room int64
		tail bool
		want string
	}{
		{0, false, ""},
		{4, false, "aaaa"},
		{4, true, "ccc\n"},
		{15, false, "aaaa\nbbbb\ncccc\n"},
	} {
		if got := string(truncate(data, tt.room, tt.tail)); got != tt.want {
			t.Errorf("truncate(%d, tail %v) = %q, want %q", tt.room, tt.tail, got, tt.want)
		}
	}
}

func TestBuildCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	src := Source{Name: "slow", Read: func(ctx context.Context) ([]byte, error) {
		cancel()
		return nil, ctx.Err()
	}}
	m, err := Build(ctx, []Source{src, static("never", "x")}, io.Discard, 0)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if len(m.Files) != 1 || m.Files[0].Error == "" {
		t.Errorf("manifest %+v", m)
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestBuildWriteError(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	if _, err := Build(context.Background(), []Source{static("a", big)}, failWriter{}, 0); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v, want the writer's", err)
	}
}
