package unit

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// FuzzDecodeSection: the host section comes from the gateway and, through
// host.unit, to root. Whatever it holds, a section that decodes renders
// files without a newline inside a value.
func FuzzDecodeSection(f *testing.F) {
	f.Add([]byte(`{"sysctl":{"settings":{"kernel.msgmax":"16384"}},"kernel-modules":{"modules":[{"name":"dummy","options":{"numdummies":"2"}}]}}`))
	f.Add([]byte(`{"hugepages":{"pages_2m":4,"pages_1g":1},"cpu":{"isolate":"1-2"},"iommu":{"vendor":"amd"}}`))
	f.Add([]byte(`{"k8s-join":{}}`))
	r := Standard()
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := r.DecodeSection(json.RawMessage(b))
		if err != nil {
			return
		}
		if m, ok := s["sysctl"]; ok {
			body, _ := Sysctl{}.decode(m)
			for _, l := range strings.Split(strings.TrimSuffix(Sysctl{}.render(body), "\n"), "\n") {
				if l != "" && !strings.HasPrefix(l, "#") && strings.Count(l, " = ") != 1 {
					t.Fatalf("rendered line %q", l)
				}
			}
		}
		if m, ok := s["kernel-modules"]; ok {
			body, _ := KernelModules{}.decode(m)
			load, opts := KernelModules{}.render(body)
			if strings.Count(load, "\n") != len(body.Modules)+1 && len(body.Modules) > 0 {
				t.Fatalf("modules-load %q for %d modules", load, len(body.Modules))
			}
			_ = opts
		}
	})
}

// FuzzAlphabets: the small checks of chars.go take exactly what the
// patterns they replace took.
func FuzzAlphabets(f *testing.F) {
	for _, s := range []string{"dummy", "kernel.msgmax", "0-3,8", "550.54.15-1", "nvidia-driver", "GPU-5f1c2d4e-0000-4000-8000-000000000000", "1g.10gb", "3g.40gb+me", "a_b", ""} {
		f.Add(s)
	}
	checks := []struct {
		re string
		fn func(string) bool
	}{
		{`^[a-z0-9_-]{1,56}$`, isModuleName},
		{`^[a-z0-9_]{1,64}$`, isParamName},
		{`^[A-Za-z0-9_.,:+-]{1,256}$`, isParamValue},
		{`^[A-Za-z0-9_.,:/+ -]{1,256}$`, isSysctlValue},
		{`^[a-z]{1,32}$`, isGovernor},
		{`^[0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?){0,63}$`, isCPUList},
		{`^[0-9][A-Za-z0-9.+~:-]{0,63}$`, isDebVersion},
		{`^[a-z0-9][a-z0-9.+-]{1,63}$`, isPackageName},
		{`^[a-z0-9][a-z0-9_]{0,31}$`, isMPSName},
		{`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`, isGPUUUID},
		{`^[1-9]g\.[0-9]{1,4}gb(\+me)?$`, isMIGProfile},
	}
	res := make([]*regexp.Regexp, len(checks))
	for i, c := range checks {
		res[i] = regexp.MustCompile(c.re)
	}
	key := regexp.MustCompile(`^[a-z0-9_]+(\.[a-z0-9_-]+)+$`)
	f.Fuzz(func(t *testing.T, s string) {
		for i, c := range checks {
			if want := res[i].MatchString(s); c.fn(s) != want {
				t.Fatalf("%q against %s: %v, the pattern says %v", s, c.re, !want, want)
			}
		}
		if len(s) <= 128 {
			want := key.MatchString(s)
			if isSysctlKey(s) != want {
				t.Fatalf("sysctl key %q: %v, the pattern says %v", s, !want, want)
			}
		}
	})
}
