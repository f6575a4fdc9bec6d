package initramfs

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/better-compute/bcd/components/disk/kmod"
	"github.com/klauspost/compress/zstd"
)

// ModuleFirmware returns the firmware files a kernel module asks for:
// the firmware= entries of its .modinfo section. A module compressed
// with zstd is read through it; another compression is an error naming
// it.
func ModuleFirmware(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasSuffix(path, ".zst"):
		d, err := zstd.NewReader(nil)
		if err != nil {
			return nil, err
		}
		defer d.Close()
		if b, err = d.DecodeAll(b, nil); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	case strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".gz"):
		return nil, fmt.Errorf("%s: reading the firmware list of a module compressed other than with zstd is not supported", path)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("%s: .modinfo: %w", path, err)
	}
	var out []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("firmware=")); ok && len(v) > 0 && !slices.Contains(out, string(v)) {
			out = append(out, string(v))
		}
	}
	return out, nil
}

type firmware struct {
	copied  []string
	missing map[string][]string // module -> files not found
}

// stageFirmware copies the firmware files plan's modules ask for from
// cfg.FirmwareRoot (as is, or compressed .zst/.xz as Debian may ship
// them) into stage/lib/firmware, and lists what is missing. A file name
// that would leave the firmware tree is refused.
func stageFirmware(cfg Config, stage string, plan kmod.Plan) (firmware, int64, error) {
	fw := firmware{missing: map[string][]string{}}
	var total int64
	src := filepath.Join(cfg.ModulesRoot, cfg.KernelRelease)
	for _, m := range plan.Modules {
		names, err := ModuleFirmware(filepath.Join(src, m.Path))
		if err != nil {
			// Loading will tell whether the module itself is sound; the
			// build says it could not tell its firmware.
			fw.missing[m.Name] = append(fw.missing[m.Name], fmt.Sprintf("(its firmware list is unreadable: %v)", err))
			continue
		}
		for _, n := range names {
			if !filepath.IsLocal(n) {
				return fw, 0, fmt.Errorf("initramfs: %s asks for firmware %q outside the firmware tree", m.Name, n)
			}
			found := false
			for _, suffix := range []string{"", ".zst", ".xz"} {
				from := filepath.Join(cfg.FirmwareRoot, n+suffix)
				st, err := os.Stat(from)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return fw, 0, err
				}
				to := filepath.Join(stage, "lib", "firmware", n+suffix)
				if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
					return fw, 0, err
				}
				if err := CopyFile(from, to, 0o644); err != nil {
					return fw, 0, err
				}
				fw.copied = append(fw.copied, n+suffix)
				total += st.Size()
				found = true
				break
			}
			if !found {
				fw.missing[m.Name] = append(fw.missing[m.Name], n)
			}
		}
	}
	return fw, total, nil
}
