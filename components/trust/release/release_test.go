package release

import (
	"crypto"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func manifest(seq uint64) Manifest {
	return Manifest{Type: Type, Version: "0.2.0", Sequence: seq, Expires: now.Add(30 * 24 * time.Hour),
		Artifacts: []Artifact{{Role: "node", Arch: "amd64", Size: 1234, SHA256: strings.Repeat("ab", 32), URL: "https://releases.example/bcd-node-0.2.0-amd64"}}}
}

func keys(t *testing.T, n int) ([]crypto.Signer, []string) {
	var ks []crypto.Signer
	var pins []string
	for range n {
		k, err := pki.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		p, _ := pki.Pin(k.Public())
		ks, pins = append(ks, k), append(pins, p)
	}
	return ks, pins
}

func signed(t *testing.T, m Manifest, ks ...crypto.Signer) []byte {
	doc, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range ks {
		if doc, err = Sign(doc, k); err != nil {
			t.Fatal(err)
		}
	}
	return doc
}

func TestVerify(t *testing.T) {
	ks, pins := keys(t, 3)
	other, _ := keys(t, 1)
	p := Policy{Pins: pins, Threshold: 2, Floor: 5}
	good := signed(t, manifest(7), ks[0], ks[2])
	m, err := Verify(good, p, now)
	if err != nil || m.Version != "0.2.0" {
		t.Fatalf("Verify = %+v, %v", m, err)
	}
	if a, err := m.Artifact("node", "amd64"); err != nil || a.Size != 1234 {
		t.Errorf("Artifact(node, amd64) = %+v, %v", a, err)
	}
	if _, err := m.Artifact("node", "arm64"); err == nil {
		t.Error("an architecture the release lacks was found")
	}
	// The same key twice counts once; a key not pinned counts not.
	doc, _ := Encode(manifest(7))
	doc, _ = Sign(doc, ks[0])
	var d Document
	json.Unmarshal(doc, &d)
	d.Signatures = append(d.Signatures, d.Signatures[0])
	twice, _ := json.Marshal(d)
	tampered := func() []byte {
		var d Document
		json.Unmarshal(good, &d)
		d.Payload = []byte(strings.Replace(string(d.Payload), `"sequence":7`, `"sequence":9`, 1))
		b, _ := json.Marshal(d)
		return b
	}()
	expired := manifest(7)
	expired.Expires = now.Add(-time.Second)
	for name, tc := range map[string]struct {
		doc  []byte
		p    Policy
		want string
	}{
		"one signature of two":       {signed(t, manifest(7), ks[1]), p, "signed by 1 of the pinned keys; 2 must sign"},
		"the same key twice":         {twice, p, "signed by 1 of the pinned keys"},
		"a key not pinned":           {signed(t, manifest(7), ks[0], other[0]), p, "signed by 1 of the pinned keys"},
		"a changed payload":          {tampered, p, "signed by 0 of the pinned keys"},
		"expired":                    {signed(t, expired, ks[0], ks[1]), p, "expired at"},
		"below the floor":            {signed(t, manifest(4), ks[0], ks[1]), p, "below the release floor 5"},
		"no pins":                    {good, Policy{Threshold: 1}, "self-update is off"},
		"a threshold above the pins": {good, Policy{Pins: pins[:1], Threshold: 2}, "self-update is off"},
		"not JSON":                   {[]byte("x"), p, "invalid character"},
		"an unknown field":           {[]byte(`{"payload":"e30=","signatures":[],"x":1}`), p, "unknown field"},
	} {
		_, err := Verify(tc.doc, tc.p, now)
		var fe *FinalError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &fe) {
			t.Errorf("%s: %v, want a final refusal with %q", name, err, tc.want)
		}
	}
	// The floor itself is taken (the release the node runs).
	if _, err := Verify(signed(t, manifest(5), ks[0], ks[1]), p, now); err != nil {
		t.Errorf("a release at the floor: %v", err)
	}
}

func TestCheck(t *testing.T) {
	for name, mod := range map[string]func(*Manifest){
		"version":      func(m *Manifest) { m.Version = "v1" },
		"sequence 0":   func(m *Manifest) { m.Sequence = 0 },
		"no expiry":    func(m *Manifest) { m.Expires = time.Time{} },
		"role":         func(m *Manifest) { m.Artifacts[0].Role = "root" },
		"arch":         func(m *Manifest) { m.Artifacts[0].Arch = "mips" },
		"sha256":       func(m *Manifest) { m.Artifacts[0].SHA256 = strings.Repeat("AB", 32) },
		"size":         func(m *Manifest) { m.Artifacts[0].Size = 0 },
		"url":          func(m *Manifest) { m.Artifacts[0].URL = "file:///bin/sh" },
		"twice":        func(m *Manifest) { m.Artifacts = append(m.Artifacts, m.Artifacts[0]) },
		"no artifacts": func(m *Manifest) { m.Artifacts = nil },
	} {
		m := manifest(1)
		mod(&m)
		if m.Check() == nil {
			t.Errorf("%s: Check passed", name)
		}
	}
}

func FuzzVerify(f *testing.F) {
	k, _ := pki.GenerateKey()
	pin, _ := pki.Pin(k.Public())
	doc, _ := Encode(manifest(3))
	doc, _ = Sign(doc, k)
	f.Add(doc)
	f.Add([]byte(`{"payload":"e30=","signatures":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Verify(b, Policy{Pins: []string{pin}, Threshold: 1, Floor: 2}, now)
		if err != nil {
			var fe *FinalError
			if !errors.As(err, &fe) {
				t.Fatalf("a refusal that is not final: %v", err)
			}
			return
		}
		if m.Check() != nil || m.Sequence < 2 || !now.Before(m.Expires) {
			t.Fatalf("verified %+v", m)
		}
	})
}

// isVersion accepts exactly what the pattern of docs/update.md names.
func TestIsVersion(t *testing.T) {
	re := regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?$`)
	for _, v := range []string{"0.2.0", "10.20.30", "1.2.3-rc.1", "1.2.3+build-7", "1.2.3-" + strings.Repeat("a", 64),
		"1.2.3-" + strings.Repeat("a", 65), "1.2", "1.2.3.4", "1.2.3-", "a.b.c", ".1.2", "1..2", "1.2.3 ", "1.2.3-é", "", "1.2.3_x", "01.2.3"} {
		if got, want := isVersion(v), re.MatchString(v); got != want {
			t.Errorf("isVersion(%q) = %v, the pattern says %v", v, got, want)
		}
	}
}

func FuzzIsVersion(f *testing.F) {
	re := regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?$`)
	f.Add("1.2.3-rc.1")
	f.Fuzz(func(t *testing.T, v string) {
		if isVersion(v) != re.MatchString(v) {
			t.Fatalf("isVersion(%q) differs from the pattern", v)
		}
	})
}
