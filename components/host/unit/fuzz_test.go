package unit

import (
	"encoding/json"
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
