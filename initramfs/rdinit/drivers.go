package rdinit

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// driverBuses are the buses whose devices' modaliases pick drivers: PCI
// (NICs, storage controllers, virtio_pci) and virtio (the devices
// virtio_pci brings up). The disks behind a SCSI controller get sd_mod,
// which every boot loads.
var driverBuses = []string{"pci", "virtio"}

// maxDriverRounds bounds the passes: a driver can bring up devices that
// ask for another (virtio_pci, then virtio_blk), never deeper than that.
const maxDriverRounds = 3

// loadDrivers loads, of the image's drivers (DriversList), those a
// device of this machine asks for: a device's modalias matching one of
// the driver's aliases. It runs in rounds until no device asks for a
// driver not yet loaded, and says which driver it loaded for which
// device.
func loadDrivers(c Config, p func(string, ...any)) {
	if c.DriversList == "" || c.Match == nil || c.Load == nil {
		return
	}
	allowed, err := readList(c.DriversList)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		p("drivers: %v", err)
		return
	}
	tried := map[string]bool{}
	var loaded []string
	for range maxDriverRounds {
		var want []string
		for _, d := range modaliases(c.SysBus) {
			for _, m := range c.Match(d.alias) {
				if !slices.Contains(allowed, m) || tried[m] {
					continue
				}
				tried[m] = true
				want = append(want, m)
				p("driver %s for %s %s (%s)", m, d.bus, d.name, d.alias)
			}
		}
		if len(want) == 0 {
			break
		}
		t := time.Now()
		rs, err := c.Load(want)
		p("%s", strings.Replace(summary(rs, time.Since(t)), "modules:", "drivers:", 1))
		for _, r := range rs {
			if r.Err != nil {
				p("driver %s %s: %v", r.Name, r.State, r.Err)
			}
		}
		if err != nil && len(rs) == 0 {
			p("drivers: %v", err)
		}
		loaded = append(loaded, want...)
		time.Sleep(100 * time.Millisecond) // the devices a driver brings up register
	}
	if len(loaded) == 0 {
		p("drivers: none of the image's %d drivers matches a device of this machine", len(allowed))
		return
	}
	p("drivers loaded for this machine: %s", strings.Join(loaded, " "))
}

// device is one device's modalias.
type device struct{ bus, name, alias string }

// modaliases reads sysBus/<bus>/devices/*/modalias for driverBuses, in
// order.
func modaliases(sysBus string) []device {
	var out []device
	for _, bus := range driverBuses {
		dir := filepath.Join(sysBus, bus, "devices")
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), "modalias"))
			if err != nil {
				continue
			}
			if a := strings.TrimSpace(string(b)); a != "" {
				out = append(out, device{bus: bus, name: e.Name(), alias: a})
			}
		}
	}
	return out
}
