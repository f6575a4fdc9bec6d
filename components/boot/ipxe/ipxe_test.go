package ipxe

import (
	"strings"
	"testing"
)

const (
	kernelURL = "http://10.0.0.1:8080/images/0b0f4c1a6d5e8e5b7a0d8f2c3e4b5a6978695a4b3c2d1e0f1a2b3c4d5e6f7a8b"
	initrdURL = "http://10.0.0.1:8080/images/9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b"
)

func TestScriptGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		boot Boot
		want string
	}{
		{
			name: "kernel, initramfs and boot parameters",
			boot: Boot{
				Kernel:  kernelURL,
				Initrd:  initrdURL,
				Cmdline: "console=ttyS0,115200 panic=-1 bc.gateway=https://gw.example.com bc.site=fsn1 bc.mac=52:54:00:12:34:56",
			},
			want: `#!ipxe
echo bcd: loading the kernel and initramfs
kernel ` + kernelURL + ` initrd=initrd console=ttyS0,115200 panic=-1 bc.gateway=https://gw.example.com bc.site=fsn1 bc.mac=52:54:00:12:34:56 || goto failed
initrd --name initrd ` + initrdURL + ` || goto failed
boot || goto failed
:failed
echo bcd: boot failed
sleep 5
exit 1
`,
		},
		{
			name: "no command line",
			boot: Boot{Kernel: "https://cache.example/k", Initrd: "https://cache.example/i?x=1&y=2"},
			want: `#!ipxe
echo bcd: loading the kernel and initramfs
kernel https://cache.example/k initrd=initrd || goto failed
initrd --name initrd https://cache.example/i?x=1&y=2 || goto failed
boot || goto failed
:failed
echo bcd: boot failed
sleep 5
exit 1
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Script(tc.boot)
			if err != nil {
				t.Fatalf("Script: %v", err)
			}
			if got != tc.want {
				t.Errorf("Script:\n--- got\n%s--- want\n%s", got, tc.want)
			}
		})
	}
}

func TestSanbootGolden(t *testing.T) {
	got, err := Sanboot("http://10.0.0.1:8080/images/abc.iso")
	if err != nil {
		t.Fatal(err)
	}
	want := `#!ipxe
echo bcd: booting the ISO
sanboot --no-describe http://10.0.0.1:8080/images/abc.iso || goto failed
:failed
echo bcd: boot failed
sleep 5
exit 1
`
	if got != want {
		t.Errorf("Sanboot:\n--- got\n%s--- want\n%s", got, want)
	}
}

func TestExitGolden(t *testing.T) {
	want := `#!ipxe
echo bcd: no boot entry for this machine
exit
`
	if got := Exit(); got != want {
		t.Errorf("Exit:\n--- got\n%s--- want\n%s", got, want)
	}
}

func TestScriptRefuses(t *testing.T) {
	ok := Boot{Kernel: kernelURL, Initrd: initrdURL, Cmdline: "console=ttyS0"}
	for _, tc := range []struct {
		name   string
		modify func(*Boot)
		want   string
	}{
		{"no kernel", func(b *Boot) { b.Kernel = "" }, "kernel: empty"},
		{"tftp kernel", func(b *Boot) { b.Kernel = "tftp://10.0.0.1/k" }, "kernel: must be an http"},
		{"relative initrd", func(b *Boot) { b.Initrd = "/images/x" }, "initrd: must be an http"},
		{"newline in URL", func(b *Boot) { b.Kernel = kernelURL + "\nshell" }, "kernel: must not contain spaces"},
		{"newline in cmdline", func(b *Boot) { b.Cmdline = "a\nshell" }, "command line: must not contain spaces"},
		{"expansion", func(b *Boot) { b.Cmdline = "x=${net0/mac}" }, "must not contain $"},
		{"separator", func(b *Boot) { b.Cmdline = "a || shell" }, "must not contain |"},
		{"and", func(b *Boot) { b.Cmdline = "a && shell" }, "the word &&"},
		{"semicolon", func(b *Boot) { b.Kernel = kernelURL + ";shell" }, "must not contain |"},
		{"quote", func(b *Boot) { b.Cmdline = `a="b c"` }, "quotes"},
		{"double space", func(b *Boot) { b.Cmdline = "a  b" }, "empty word"},
		{"own initrd", func(b *Boot) { b.Cmdline = "initrd=other" }, "must not name an initrd"},
		{"password", func(b *Boot) { b.Initrd = "http://u:p@h/i" }, "user name"},
		{"too long", func(b *Boot) { b.Cmdline = strings.Repeat("a", MaxCmdlineLen+1) }, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := ok
			tc.modify(&b)
			_, err := Script(b)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Script: %v, want an error containing %q", err, tc.want)
			}
		})
	}
	if _, err := Sanboot("http://h/x.iso\nshell"); err == nil {
		t.Error("Sanboot took a URL with a newline")
	}
}
