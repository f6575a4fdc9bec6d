package resident

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Drop unmaps from this process the resident pages of its binary's
// read-only mappings (its code and read-only data), and returns how many
// bytes those mappings span. The writable ones (data, bss, heap) are left
// alone: their pages may differ from the file.
func Drop() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("resident: %w", err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("resident: %w", err)
	}
	defer f.Close()
	var spans [][2]uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ADDR-ADDR PERMS OFFSET DEV INODE PATH
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || fs[5] != exe || strings.Contains(fs[1], "w") {
			continue
		}
		from, to, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(from, 16, 64)
		b, err2 := strconv.ParseUint(to, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			continue
		}
		spans = append(spans, [2]uintptr{uintptr(a), uintptr(b)})
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("resident: read /proc/self/maps: %w", err)
	}
	var n int64
	for _, s := range spans {
		// The addresses are the binary's own mappings, never Go memory:
		// passed as numbers, not as a slice the runtime would track.
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, s[0], s[1]-s[0], unix.MADV_RANDOM); e != 0 {
			return n, fmt.Errorf("resident: madvise %x-%x: %w", s[0], s[1], e)
		}
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, s[0], s[1]-s[0], unix.MADV_DONTNEED); e != 0 {
			return n, fmt.Errorf("resident: madvise %x-%x: %w", s[0], s[1], e)
		}
		n += int64(s[1] - s[0])
	}
	return n, nil
}
