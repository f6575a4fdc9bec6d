package xid

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Event
	}{
		{
			name: "kmsg 79 with pid and name",
			line: "6,1234,5678901,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=foo, GPU has fallen off the bus.",
			want: Event{Code: 79, PCIBusID: "0000:17:00", Message: "GPU has fallen off the bus.", At: 5678901 * time.Microsecond},
		},
		{
			name: "dmesg 48 unknown process",
			line: "[   12.345678] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
			want: Event{Code: 48, PCIBusID: "0000:3b:00", Message: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.", At: 12345678 * time.Microsecond},
		},
		{
			name: "13 without pid (older driver)",
			line: "[ 8123.5] NVRM: Xid (PCI:0000:65:00): 13, Graphics SM Warp Exception on (GPC 3, TPC 1, SM 0): Out Of Range Address",
			want: Event{Code: 13, PCIBusID: "0000:65:00", Message: "Graphics SM Warp Exception on (GPC 3, TPC 1, SM 0): Out Of Range Address", At: 8123*time.Second + 500*time.Millisecond},
		},
		{
			name: "31 MMU fault with channel",
			line: "4,2290,734221330,-;NVRM: Xid (PCI:0000:CA:00): 31, pid=40211, name=python3, Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ 0x7f3a_1c200000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
			want: Event{Code: 31, PCIBusID: "0000:ca:00", Message: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_2 faulted @ 0x7f3a_1c200000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", At: 734221330 * time.Microsecond},
		},
		{
			name: "43 channel only",
			line: "4,812,99887766,-;NVRM: Xid (PCI:0000:4e:00): 43, pid=5150, name=train, Ch 00000008",
			want: Event{Code: 43, PCIBusID: "0000:4e:00", Message: "Ch 00000008", At: 99887766 * time.Microsecond},
		},
		{
			name: "43 bare channel, no pid",
			line: "NVRM: Xid (PCI:0000:4e:00): 43, Ch 0000000a",
			want: Event{Code: 43, PCIBusID: "0000:4e:00", Message: "Ch 0000000a"},
		},
		{
			name: "63 row remap",
			line: "4,90,1000,-;NVRM: Xid (PCI:0000:b1:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row marked for remapping, reset gpu to activate.",
			want: Event{Code: 63, PCIBusID: "0000:b1:00", Message: "Row Remapper: New row marked for remapping, reset gpu to activate.", At: time.Millisecond},
		},
		{
			name: "64 row remap failure",
			line: "[ 77.000001] NVRM: Xid (PCI:0000:b1:00): 64, pid='<unknown>', name=<unknown>, Row Remapper Error: failed to remap row in bank 3",
			want: Event{Code: 64, PCIBusID: "0000:b1:00", Message: "Row Remapper Error: failed to remap row in bank 3", At: 77*time.Second + time.Microsecond},
		},
		{
			name: "74 NVLink",
			line: "3,501,2000000,-;NVRM: Xid (PCI:0000:07:00): 74, pid=1, name=nv-fabricmana, NVLink: fatal error detected on link 11(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
			want: Event{Code: 74, PCIBusID: "0000:07:00", Message: "NVLink: fatal error detected on link 11(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", At: 2 * time.Second},
		},
		{
			name: "92 SBE rate",
			line: "4,9,3,-;NVRM: Xid (PCI:0000:17:00): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate",
			want: Event{Code: 92, PCIBusID: "0000:17:00", Message: "High single-bit ECC error rate", At: 3 * time.Microsecond},
		},
		{
			name: "94 contained",
			line: "4,10,4,-;NVRM: Xid (PCI:0000:17:00): 94, pid=3321, name=vllm, Contained: SM (0x1). RST: No, D-RST: No",
			want: Event{Code: 94, PCIBusID: "0000:17:00", Message: "Contained: SM (0x1). RST: No, D-RST: No", At: 4 * time.Microsecond},
		},
		{
			name: "95 uncontained",
			line: "3,11,5,-;NVRM: Xid (PCI:0000:17:00): 95, pid='<unknown>', name=<unknown>, Uncontained: FBHUB. RST: Yes, D-RST: No",
			want: Event{Code: 95, PCIBusID: "0000:17:00", Message: "Uncontained: FBHUB. RST: Yes, D-RST: No", At: 5 * time.Microsecond},
		},
		{
			name: "119 GSP timeout",
			line: "3,4410,86400000000,-;NVRM: Xid (PCI:0000:c1:00): 119, pid=2718, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU3 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x204).",
			want: Event{Code: 119, PCIBusID: "0000:c1:00", Message: "Timeout after 6s of waiting for RPC response from GPU3 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x204).", At: 86400 * time.Second},
		},
		{
			name: "154 recovery action",
			line: "4,77,123456,-;NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
			want: Event{Code: 154, PCIBusID: "0000:3b:00", Message: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", At: 123456 * time.Microsecond},
		},
		{
			name: "older driver without PCI: and with register dump",
			line: "[ 1.5] NVRM: Xid (0000:02:00): 13, 0002 00000000 000090c0 00001b0c 00000000 00000000",
			want: Event{Code: 13, PCIBusID: "0000:02:00", Message: "0002 00000000 000090c0 00001b0c 00000000 00000000", At: 1500 * time.Millisecond},
		},
		{
			name: "function and long domain",
			line: "NVRM: Xid (PCI:00000000:17:00.0): 79, GPU has fallen off the bus.",
			want: Event{Code: 79, PCIBusID: "0000:17:00", Message: "GPU has fallen off the bus."},
		},
		{
			name: "journalctl prefix and trailing newline",
			line: "Mar 04 10:11:12 gpu-07 kernel: NVRM: Xid (PCI:0000:17:00): 79, pid=0, name=swapper/0, GPU has fallen off the bus.\n",
			want: Event{Code: 79, PCIBusID: "0000:17:00", Message: "GPU has fallen off the bus."},
		},
		{
			name: "syslog priority before the dmesg time",
			line: "<4>[ 2.25] NVRM: Xid (PCI:0000:17:00): 63, Row Remapper: New row marked for remapping, reset gpu to activate.",
			want: Event{Code: 63, PCIBusID: "0000:17:00", Message: "Row Remapper: New row marked for remapping, reset gpu to activate.", At: 2250 * time.Millisecond},
		},
		{
			name: "code alone",
			line: "NVRM: Xid (PCI:0000:17:00): 79",
			want: Event{Code: 79, PCIBusID: "0000:17:00"},
		},
		{
			name: "unrecognised GPU name keeps the event",
			line: "NVRM: Xid (GPU 0): 48, An uncorrectable double bit error",
			want: Event{Code: 48, Message: "An uncorrectable double bit error"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := Parse([]byte(tt.line))
			if !ok {
				t.Fatalf("Parse(%q) not ok", tt.line)
			}
			if got != tt.want {
				t.Errorf("Parse(%q)\n got %+v\nwant %+v", tt.line, got, tt.want)
			}
		})
	}
}

func TestParseIgnores(t *testing.T) {
	for _, line := range []string{
		"",
		"6,1,0,-;Linux version 6.8.0-45-generic",
		"6,700,9000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
		"4,701,9000001,-;NVRM: GPU at PCI:0000:17:00: GPU-2f0b6a34-1c6e-4a44-9a0f-3b2d8c1e7a55",
		"4,702,9000002,-;NVRM: GPU0 _kgspLogXid119: ********************* GSP Timeout *********************",
		"3,703,9000003,-;NVRM: GPU Board Serial Number: 1650123456789",
		"[ 4.0] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
		"user ran: grep Xid /var/log/syslog",
		"NVRM: Xid (PCI:0000:17:00: 79, missing paren",
		"NVRM: Xid (PCI:0000:17:00): seventy-nine",
		"NVRM: Xid (PCI:0000:17:00) 79, no colon",
		"NVRM: Xid (PCI:0000:17:00): 79x, junk after the code",
		"NVRM: Xid (PCI:0000:17:00): 12345678, too long",
	} {
		if ev, ok := Parse([]byte(line)); ok {
			t.Errorf("Parse(%q) = %+v, want not ok", line, ev)
		}
	}
}

func TestTimestamp(t *testing.T) {
	tests := []struct {
		prefix string
		want   time.Duration
	}{
		{"6,1,42,-;", 42 * time.Microsecond},
		{"6,1,42,c,extra;", 42 * time.Microsecond},
		{"6,1,x,-;", 0},
		{"6,1,99999999999999999999,-;", 0},
		{"[   0.000000] ", 0},
		{"[ 3.1] ", 3100 * time.Millisecond},
		{"[3] ", 3 * time.Second},
		{"[ 3.1234567891] ", 0},
		{"[99999999999999999999.0] ", 0},
		{"[ 3.1 ", 0},
		{"kernel: ", 0},
	}
	for _, tt := range tests {
		if got := timestamp([]byte(tt.prefix)); got != tt.want {
			t.Errorf("timestamp(%q) = %v, want %v", tt.prefix, got, tt.want)
		}
	}
}

// records replays /dev/kmsg: one record per Read, then an error.
type records struct {
	recs []string
	end  error
}

func (r *records) Read(p []byte) (int, error) {
	if len(r.recs) == 0 {
		return 0, r.end
	}
	n := copy(p, r.recs[0])
	r.recs[0] = r.recs[0][n:]
	if r.recs[0] == "" {
		r.recs = r.recs[1:]
	}
	return n, nil
}

func TestReadKmsg(t *testing.T) {
	stream := []string{
		"6,1,0,-;Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)\n",
		"6,2,100,-;Command line: BOOT_IMAGE=/vmlinuz root=UUID=1234 ro\n",
		"4,700,9000000,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=foo, GPU has fallen off the bus.\n",
		" SUBSYSTEM=pci\n",
		" DEVICE=+pci:0000:17:00.0\n",
		"4,701,9000500,-;NVRM: GPU 0000:17:00.0: GPU has fallen off the bus.\n",
		"3,702,9100000,c;NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error\n",
		" NVRM: Xid (PCI:0000:99:00): 13, a continuation line is not a record\n",
		"4,703,9200000,-;NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", // no final newline
	}
	want := []Event{
		{Code: 79, PCIBusID: "0000:17:00", Message: "GPU has fallen off the bus.", At: 9 * time.Second},
		{Code: 48, PCIBusID: "0000:3b:00", Message: "An uncorrectable double bit error", At: 9100 * time.Millisecond},
		{Code: 154, PCIBusID: "0000:3b:00", Message: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", At: 9200 * time.Millisecond},
	}
	tests := []struct {
		name string
		r    io.Reader
	}{
		{"one record per read", &records{recs: append([]string(nil), stream...), end: io.EOF}},
		{"one stream", strings.NewReader(strings.Join(stream, ""))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readKmsg(tt.r)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("got %d events %+v, want %d", len(got), got, len(want))
			}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("event %d\n got %+v\nwant %+v", i, got[i], want[i])
				}
			}
		})
	}
}

func TestReadKmsgLongLineAndError(t *testing.T) {
	long := "6,5,1,-;" + strings.Repeat("x", maxLine+100) + " NVRM: Xid (PCI:0000:17:00): 79, hidden in a too long line\n"
	xid := "4,6,2,-;NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n"
	boom := errors.New("boom")
	got, err := readKmsg(&records{recs: []string{long, xid}, end: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if len(got) != 1 || got[0].Code != 79 || got[0].At != 2*time.Microsecond {
		t.Fatalf("got %+v, want the one Xid after the long line", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"6,1234,5678901,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1234, name=foo, GPU has fallen off the bus.",
		"[  12.345] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
		"NVRM: Xid (0000:02:00): 13, 0002 00000000",
		"<4>[ 2.25] NVRM: Xid (PCI:00000000:17:00.0): 31, Ch 00000010",
		"NVRM: Xid (",
		"6,1,99999999999999999999,-;NVRM: Xid (x): 1",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, ok := Parse(line)
		if !ok {
			return
		}
		if ev.Code < 0 || ev.At < 0 {
			t.Fatalf("Parse(%q) = %+v", line, ev)
		}
		if _, err := readKmsg(strings.NewReader(string(line))); err != nil {
			t.Fatal(err)
		}
	})
}
