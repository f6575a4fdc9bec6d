package buildinfo

import "testing"

func TestTagsMatchFakeHW(t *testing.T) {
	has := false
	for _, tag := range Tags() {
		if tag == "fakehw" {
			has = true
		}
	}
	if has != FakeHW {
		t.Fatalf("Tags() = %v but FakeHW = %v", Tags(), FakeHW)
	}
}
