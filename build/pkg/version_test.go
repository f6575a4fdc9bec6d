package main

import "testing"

func TestPackageVersion(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"1.2.3", "1.2.3"},
		{"v1.2.3", "1.2.3"},
		{"1.2.3-4-gabcdef0", "1.2.3+git4.gabcdef0"},
		{"v1.2.3-12-gabcdef0-dirty", "1.2.3+git12.gabcdef0.dirty"},
		{"0.1.0-dev", "0.1.0~dev"},
		{"1.2.3-rc.1", "1.2.3~rc.1"},
		{"0.0.0~git20260101.abc1234", "0.0.0~git20260101.abc1234"},
	} {
		got, err := packageVersion(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("packageVersion(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "v", "abc1234", "1.2 3", "1.2/3", "1.2_3", "-1"} {
		if got, err := packageVersion(bad); err == nil {
			t.Errorf("packageVersion(%q) = %q, want an error", bad, got)
		}
	}
}
