package nvsmi

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Listed is one GPU line of `nvidia-smi -L` with its MIG devices.
type Listed struct {
	Index int         `json:"index"`
	Name  string      `json:"name"`
	UUID  string      `json:"uuid"`
	MIG   []ListedMIG `json:"mig,omitempty"`
}

// ListedMIG is one MIG device line of `nvidia-smi -L`.
type ListedMIG struct {
	Profile string `json:"profile"` // 3g.40gb
	Device  int    `json:"device"`
	UUID    string `json:"uuid"`
}

// lines scans r line by line, with ANSI escape sequences (nvidia-smi
// underlines table headers on a terminal) removed.
func lines(r io.Reader, fn func(string)) error {
	sc := bufio.NewScanner(io.LimitReader(r, maxOutput))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fn(stripANSI(sc.Text()))
	}
	return sc.Err()
}

func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != 0x1b {
			b.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == '[' {
			i += 2
			for i < len(s) && (s[i] < 0x40 || s[i] > 0x7e) {
				i++
			}
		}
	}
	return b.String()
}

// uuidIn returns the UUID of "… (UUID: GPU-…)".
func uuidIn(s string) string {
	_, rest, ok := strings.Cut(s, "(UUID:")
	if !ok {
		return ""
	}
	u, _, _ := strings.Cut(rest, ")")
	return strings.TrimSpace(u)
}

// gpuLine reads "GPU 3: NAME (UUID: GPU-…)".
func gpuLine(line string) (index int, name, uuid string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), "GPU ")
	if !found {
		return 0, "", "", false
	}
	idx, rest, found := strings.Cut(rest, ":")
	if !found {
		return 0, "", "", false
	}
	n, err := strconv.Atoi(strings.TrimSpace(idx))
	if err != nil || n < 0 {
		return 0, "", "", false
	}
	name = rest
	if i := strings.LastIndex(rest, "(UUID:"); i >= 0 {
		name = rest[:i]
	}
	return n, strings.TrimSpace(name), uuidIn(rest), true
}

// ParseList reads the output of `nvidia-smi -L`.
func ParseList(r io.Reader) ([]Listed, error) {
	var out []Listed
	err := lines(r, func(line string) {
		if i, name, uuid, ok := gpuLine(line); ok {
			out = append(out, Listed{Index: i, Name: name, UUID: uuid})
			return
		}
		t := strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(t, "MIG ")
		if !ok || len(out) == 0 {
			return
		}
		f := strings.Fields(rest)
		// MIG 3g.40gb     Device  0: (UUID: MIG-…)
		if len(f) < 3 || f[1] != "Device" {
			return
		}
		dev, err := strconv.Atoi(strings.TrimSuffix(f[2], ":"))
		if err != nil {
			return
		}
		last := &out[len(out)-1]
		last.MIG = append(last.MIG, ListedMIG{Profile: f[0], Device: dev, UUID: uuidIn(rest)})
	})
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi -L: %w", err)
	}
	return out, nil
}

// ParseComputeCap reads `nvidia-smi --query-gpu=uuid,compute_cap
// --format=csv,noheader` into compute capabilities by UUID.
func ParseComputeCap(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	err := lines(r, func(line string) {
		uuid, cc, ok := strings.Cut(line, ",")
		uuid, cc = strings.TrimSpace(uuid), value(cc)
		if !ok || uuid == "" || cc == "" {
			return
		}
		out[uuid] = cc
	})
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi --query-gpu: %w", err)
	}
	return out, nil
}

// Topology is the matrix of `nvidia-smi topo -m`.
type Topology struct {
	// Columns are the devices of the matrix in order: GPU0…, NIC0….
	Columns []string  `json:"columns"`
	Rows    []TopoRow `json:"rows"`
	// NICs maps NIC0… to the RDMA device names of the NIC legend.
	NICs map[string]string `json:"nics,omitempty"`
}

// TopoRow is one row of the matrix.
type TopoRow struct {
	Device       string            `json:"device"`
	Links        map[string]string `json:"links"` // column → X, NV18, PIX, SYS, …
	CPUAffinity  string            `json:"cpu_affinity,omitempty"`
	NUMAAffinity string            `json:"numa_affinity,omitempty"`
	GPUNUMAID    string            `json:"gpu_numa_id,omitempty"`
}

// splitCells splits a matrix line on tabs, or on runs of two or more spaces
// when a terminal turned the tabs into spaces.
func splitCells(line string) []string {
	if strings.Contains(line, "\t") {
		return strings.Split(line, "\t")
	}
	var cells []string
	for _, c := range strings.Split(line, "  ") {
		if strings.TrimSpace(c) != "" {
			cells = append(cells, c)
		}
	}
	return cells
}

func isDevice(s string) bool {
	for _, p := range []string{"GPU", "NIC", "NVS"} {
		if rest, ok := strings.CutPrefix(s, p); ok && rest != "" {
			if _, err := strconv.Atoi(rest); err == nil {
				return true
			}
		}
	}
	return false
}

// ParseTopo reads the output of `nvidia-smi topo -m`.
func ParseTopo(r io.Reader) (Topology, error) {
	var t Topology
	var extra []string // the affinity columns after the devices
	legend := false
	err := lines(r, func(line string) {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			return
		case strings.HasPrefix(trimmed, "NIC Legend"):
			legend = true
			return
		case strings.HasPrefix(trimmed, "Legend"):
			legend = false
			return
		}
		if legend {
			// "  NIC0: mlx5_0"
			k, v, ok := strings.Cut(trimmed, ":")
			if ok && isDevice(k) {
				if t.NICs == nil {
					t.NICs = map[string]string{}
				}
				t.NICs[k] = strings.TrimSpace(v)
			}
			return
		}
		cells := splitCells(line)
		if t.Columns == nil {
			var cols []string
			for _, c := range cells {
				c = strings.TrimSpace(c)
				switch {
				case c == "":
				case isDevice(c):
					if len(extra) == 0 {
						cols = append(cols, c)
					}
				default:
					extra = append(extra, c)
				}
			}
			if len(cols) > 0 {
				t.Columns = cols
			} else {
				extra = nil
			}
			return
		}
		name := strings.TrimSpace(cells[0])
		if !isDevice(name) {
			return
		}
		row := TopoRow{Device: name, Links: map[string]string{}}
		rest := cells[1:]
		for i, col := range t.Columns {
			if i >= len(rest) {
				break
			}
			row.Links[col] = strings.TrimSpace(rest[i])
		}
		var vals []string
		if len(rest) > len(t.Columns) {
			for _, c := range rest[len(t.Columns):] {
				if c = strings.TrimSpace(c); c != "" {
					vals = append(vals, c)
				}
			}
		}
		for i, v := range vals {
			if i >= len(extra) {
				break
			}
			switch extra[i] {
			case "CPU Affinity":
				row.CPUAffinity = value(v)
			case "NUMA Affinity":
				row.NUMAAffinity = value(v)
			case "GPU NUMA ID":
				row.GPUNUMAID = value(v)
			}
		}
		t.Rows = append(t.Rows, row)
	})
	if err != nil {
		return Topology{}, fmt.Errorf("read nvidia-smi topo -m: %w", err)
	}
	return t, nil
}

// NVLinkStatus is one GPU of `nvidia-smi nvlink -s`.
type NVLinkStatus struct {
	Index int      `json:"index"`
	UUID  string   `json:"uuid"`
	Links []NVLink `json:"links,omitempty"`
	// Note is a message nvidia-smi printed instead of links, such as
	// "Nvlink queries are not supported for Devices in MIG mode".
	Note string `json:"note,omitempty"`
}

// ParseNVLink reads the output of `nvidia-smi nvlink -s`: each link's speed,
// or <inactive>.
func ParseNVLink(r io.Reader) ([]NVLinkStatus, error) {
	var out []NVLinkStatus
	err := lines(r, func(line string) {
		if i, _, uuid, ok := gpuLine(line); ok {
			out = append(out, NVLinkStatus{Index: i, UUID: uuid})
			return
		}
		if len(out) == 0 {
			return
		}
		last := &out[len(out)-1]
		t := strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(t, "Link ")
		if !ok {
			if t != "" && last.Note == "" {
				last.Note = t
			}
			return
		}
		n, speed, ok := strings.Cut(rest, ":")
		if !ok {
			return
		}
		link, err := strconv.Atoi(strings.TrimSpace(n))
		if err != nil || link < 0 {
			return
		}
		l := NVLink{Link: link}
		speed = strings.TrimSpace(speed)
		if !strings.Contains(strings.ToLower(speed), "inactive") {
			if f, ok := number(speed); ok {
				l.Active = true
				l.SpeedGBps = f
			}
		}
		last.Links = append(last.Links, l)
	})
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi nvlink -s: %w", err)
	}
	return out, nil
}

// ParseMIGProfiles reads the table of `nvidia-smi mig -lgip`: one row per
// GPU instance profile (the second line of each row, with CE, JPEG and OFA
// counts, is skipped).
func ParseMIGProfiles(r io.Reader) ([]MIGProfile, error) {
	var out []MIGProfile
	err := lines(r, func(line string) {
		t := strings.Trim(strings.TrimSpace(line), "|")
		f := strings.Fields(t)
		// GPU  MIG  NAME  ID  FREE/TOTAL  MEMORY  …
		if len(f) < 6 || f[1] != "MIG" {
			return
		}
		gpu, err1 := strconv.Atoi(f[0])
		id, err2 := strconv.Atoi(f[3])
		free, total, ok := strings.Cut(f[4], "/")
		fr, err3 := strconv.Atoi(free)
		to, err4 := strconv.Atoi(total)
		mem, ok2 := number(f[5])
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil || !ok || !ok2 {
			return
		}
		out = append(out, MIGProfile{GPU: gpu, Name: f[2], ID: id, Free: fr, Total: to, MemoryGiB: mem})
	})
	if err != nil {
		return nil, fmt.Errorf("read nvidia-smi mig -lgip: %w", err)
	}
	return out, nil
}
