package unit

import "strings"

// The units check names and values by their alphabet with these small
// functions rather than regexp, which would add about 200 kB to bcd
// helper (its size budget, docs/helper.md).

const (
	lower  = "abcdefghijklmnopqrstuvwxyz"
	upper  = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	digits = "0123456789"
	hex    = digits + "abcdefABCDEF"
)

// only reports whether s is min to max bytes, all of them in set.
func only(s string, min, max int, set string) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(set, s[i]) < 0 {
			return false
		}
	}
	return true
}

func isModuleName(s string) bool  { return only(s, 1, 56, lower+digits+"_-") }
func isParamName(s string) bool   { return only(s, 1, 64, lower+digits+"_") }
func isParamValue(s string) bool  { return only(s, 1, 256, lower+upper+digits+"_.,:+-") }
func isSysctlValue(s string) bool { return only(s, 1, 256, lower+upper+digits+"_.,:/+ -") }
func isGovernor(s string) bool    { return only(s, 1, 32, lower) }

// isSysctlKey: dotted, at least two parts; the first of [a-z0-9_], the
// others of [a-z0-9_-].
func isSysctlKey(s string) bool {
	parts := strings.Split(s, ".")
	if len(s) > 128 || len(parts) < 2 || !only(parts[0], 1, 128, lower+digits+"_") {
		return false
	}
	for _, p := range parts[1:] {
		if !only(p, 1, 128, lower+digits+"_-") {
			return false
		}
	}
	return true
}

// isCPUList: 1 to 64 items, each N or N-M of 1 to 4 digits.
func isCPUList(s string) bool {
	items := strings.Split(s, ",")
	if len(items) > 64 {
		return false
	}
	for _, it := range items {
		a, b, ranged := strings.Cut(it, "-")
		if !only(a, 1, 4, digits) || ranged && !only(b, 1, 4, digits) {
			return false
		}
	}
	return true
}

func isDebVersion(s string) bool {
	return len(s) > 0 && s[0] >= '0' && s[0] <= '9' && only(s, 1, 64, lower+upper+digits+".+~:-")
}

func isPackageName(s string) bool {
	return len(s) > 1 && strings.IndexByte(lower+digits, s[0]) >= 0 && only(s, 2, 64, lower+digits+".+-")
}

func isMPSName(s string) bool {
	return len(s) > 0 && strings.IndexByte(lower+digits, s[0]) >= 0 && only(s, 1, 32, lower+digits+"_")
}

// isGPUUUID: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx in hex.
func isGPUUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
	parts := strings.Split(rest, "-")
	if !ok || len(parts) != 5 {
		return false
	}
	for i, n := range []int{8, 4, 4, 4, 12} {
		if !only(parts[i], n, n, hex) {
			return false
		}
	}
	return true
}

// isMIGProfile: Ng.Mgb with N 1 to 9 and M 1 to 4 digits, optionally +me.
func isMIGProfile(s string) bool {
	s = strings.TrimSuffix(s, "+me")
	g, mem, ok := strings.Cut(s, "g.")
	return ok && only(g, 1, 1, "123456789") && strings.HasSuffix(mem, "gb") && only(strings.TrimSuffix(mem, "gb"), 1, 4, digits)
}
