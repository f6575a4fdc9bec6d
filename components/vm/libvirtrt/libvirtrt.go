// Package libvirtrt is the libvirt-kvm runtime (vmruntime.Runtime) of an
// unprivileged bcd node: it reads libvirtd through its read-only socket
// (virsh -r: list, domstate, dumpxml --inactive) and changes nothing
// itself. Every change is one of bcd helper's libvirt.* operations:
// libvirt.define carries only the instance id with the instances section
// of the held signed spec and its proof (the helper renders the domain
// from the section itself), the others only the id. A domain whose bcd
// metadata does not name it is listed as not owned and never touched;
// one another node on the same libvirtd made (its own disks in that
// node's data directory) is not listed at all and never touched either.
// docs/instances.md, "Runtimes".
package libvirtrt

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/better-compute/bcd/components/helper/helperclient"
	"github.com/better-compute/bcd/components/helper/wire"
	"github.com/better-compute/bcd/components/trust/rootsig"
	"github.com/better-compute/bcd/components/vm/vmruntime"
)

// Name is the runtime's kind, as Hello.drivers lists it.
const Name = "libvirt-kvm"

// Helper sends one request to bcd helper (helperclient.Client).
type Helper interface {
	Do(ctx context.Context, req *wire.Request) (*wire.Response, error)
}

// Config wires the runtime.
type Config struct {
	// URI is libvirtd's read-only connection: qemu:///system, or with
	// ?socket= the read-only socket root's [instances] libvirt_socket
	// sits beside.
	URI string
	// InstancesDir is data_dir/instances: a disk in an instance's own
	// directory is named by its file name; any other is a base image.
	InstancesDir string
	// Helper runs the libvirt.* operations.
	Helper Helper
	// Signed returns the instances section of the held signed spec and
	// its proof, for libvirt.define of m (the helper takes m from the
	// section, not from the request).
	Signed func(m vmruntime.Machine) (section []byte, proof rootsig.Proof, err error)
}

// Runtime is the libvirt-kvm runtime.
type Runtime struct{ cfg Config }

// New returns the runtime.
func New(cfg Config) *Runtime { return &Runtime{cfg: cfg} }

var _ vmruntime.Runtime = (*Runtime)(nil)

// Name is "libvirt-kvm".
func (r *Runtime) Name() string { return Name }

// virshPath is virsh in the system directories ("" when not installed).
func virshPath() string {
	for _, dir := range []string{"/usr/bin", "/bin", "/usr/sbin", "/sbin"} {
		if fi, err := os.Stat(dir + "/virsh"); err == nil && fi.Mode().IsRegular() {
			return dir + "/virsh"
		}
	}
	return ""
}

// Installed reports whether this host has libvirt's client (virsh): a
// host without it is no VPS host, and the role leaves the instances
// section out (a spec naming instances then answers UNSUPPORTED).
func Installed() bool { return virshPath() != "" }

// virsh runs virsh -r -q -c URI args, found in the system directories.
func (r *Runtime) virsh(ctx context.Context, args ...string) (string, error) {
	p := virshPath()
	if p == "" {
		return "", errors.New("virsh is not installed (libvirt-clients)")
	}
	cmd := exec.CommandContext(ctx, p, append([]string{"-r", "-q", "-c", r.cfg.URI}, args...)...)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("virsh %s: %w: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// List reports every domain: its state, and for a domain bcd's metadata
// names, its definition.
func (r *Runtime) List(ctx context.Context) ([]vmruntime.Domain, error) {
	out, err := r.virsh(ctx, "list", "--all", "--name")
	if err != nil {
		return nil, err
	}
	var l []vmruntime.Domain
	for _, name := range strings.Fields(out) {
		d, found, err := r.domain(ctx, name)
		if err != nil {
			return nil, err
		}
		if found && d.owner != OtherNode {
			l = append(l, d.Domain)
		}
	}
	sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
	return l, nil
}

// domain is one domain read, with whose it is.
type domain struct {
	vmruntime.Domain
	owner Owner
}

// domain reads one domain; found is false when there is none of that
// name.
func (r *Runtime) domain(ctx context.Context, name string) (domain, bool, error) {
	state, err := r.virsh(ctx, "domstate", name)
	if err != nil {
		if strings.Contains(err.Error(), "failed to get domain") {
			return domain{}, false, nil
		}
		return domain{}, false, err
	}
	d := domain{Domain: vmruntime.Domain{ID: name, State: State(strings.TrimSpace(state))}}
	def, err := r.virsh(ctx, "dumpxml", "--inactive", name)
	if err != nil {
		if strings.Contains(err.Error(), "failed to get domain") {
			return domain{}, false, nil
		}
		return domain{}, false, err
	}
	m, owner, err := ParseDomain([]byte(def), r.cfg.InstancesDir)
	if err != nil {
		return domain{}, false, fmt.Errorf("domain %s: %w", name, err)
	}
	d.owner = owner
	if owner == ThisNode && m.ID == name {
		d.Owned, d.Machine = true, m
	}
	return d, true, nil
}

// Owner says whose a domain is.
type Owner int

const (
	// NotBcd: bcd's metadata does not name the domain (made by hand).
	NotBcd Owner = iota
	// ThisNode: bcd's, its own disks in this node's instances directory.
	ThisNode
	// OtherNode: bcd's, made for another node on the same libvirtd (its
	// own disks in another directory; root's metadata names that node).
	OtherNode
)

// State maps virsh domstate's words to RUNNING, PAUSED or STOPPED.
func State(s string) string {
	switch s {
	case "running", "blocked", "in shutdown", "idle":
		return vmruntime.Running
	case "paused", "pmsuspended":
		return vmruntime.Paused
	}
	return vmruntime.Stopped
}

// domainDef is what ParseDomain reads of libvirt's definition.
type domainDef struct {
	Name     string `xml:"name"`
	Metadata struct {
		Instance *struct {
			ID string `xml:"id,attr"`
		} `xml:"https://bcd.dev/xmlns/instance/v1 instance"`
	} `xml:"metadata"`
	Memory struct {
		Unit  string `xml:"unit,attr"`
		Value int64  `xml:",chardata"`
	} `xml:"memory"`
	VCPU    int `xml:"vcpu"`
	Devices struct {
		Disks []struct {
			Device string `xml:"device,attr"`
			Driver struct {
				Type string `xml:"type,attr"`
			} `xml:"driver"`
			Source struct {
				File string `xml:"file,attr"`
			} `xml:"source"`
			Boot *struct {
				Order int `xml:"order,attr"`
			} `xml:"boot"`
		} `xml:"disk"`
		Interfaces []struct {
			MAC struct {
				Address string `xml:"address,attr"`
			} `xml:"mac"`
			Source struct {
				Bridge string `xml:"bridge,attr"`
			} `xml:"source"`
			Target struct {
				Dev string `xml:"dev,attr"`
			} `xml:"target"`
		} `xml:"interface"`
	} `xml:"devices"`
}

// ParseDomain reads a domain's definition as libvirt prints it: whose it
// is (bcd's metadata names the instance, and its own disks, at least
// one, are in instancesDir/<id> for this node's), and for this node's its
// machine. GPUs are not read back (the helper resolves them from the
// section).
func ParseDomain(def []byte, instancesDir string) (vmruntime.Machine, Owner, error) {
	var d domainDef
	if err := xml.Unmarshal(def, &d); err != nil {
		return vmruntime.Machine{}, NotBcd, err
	}
	if d.Metadata.Instance == nil || d.Metadata.Instance.ID != d.Name {
		return vmruntime.Machine{}, NotBcd, nil
	}
	kib := d.Memory.Value
	switch d.Memory.Unit {
	case "", "KiB", "k":
	case "MiB", "M":
		kib *= 1024
	default:
		return vmruntime.Machine{}, NotBcd, fmt.Errorf("memory in %q", d.Memory.Unit)
	}
	m := vmruntime.Machine{ID: d.Name, VCPUs: d.VCPU, MemoryMiB: int(kib / 1024)}
	own := filepath.Join(instancesDir, d.Name)
	for _, x := range d.Devices.Disks {
		disk := vmruntime.Disk{Name: filepath.Base(x.Source.File), Format: x.Driver.Type, CDROM: x.Device == "cdrom", Base: filepath.Dir(x.Source.File) != own}
		if x.Boot != nil {
			disk.Boot = x.Boot.Order
		}
		m.Disks = append(m.Disks, disk)
	}
	for _, i := range d.Devices.Interfaces {
		m.Taps = append(m.Taps, vmruntime.Tap{Name: i.Target.Dev, Bridge: i.Source.Bridge, MAC: i.MAC.Address})
	}
	if !slices.ContainsFunc(m.Disks, func(d vmruntime.Disk) bool { return !d.Base }) {
		return vmruntime.Machine{}, OtherNode, nil
	}
	return m, ThisNode, nil
}

// look finds an owned domain: ErrNotFound, ErrForeign.
func (r *Runtime) look(ctx context.Context, id string) (vmruntime.Domain, error) {
	d, found, err := r.domain(ctx, id)
	switch {
	case err != nil:
		return d.Domain, err
	case !found:
		return d.Domain, fmt.Errorf("%s: %w", id, vmruntime.ErrNotFound)
	case d.owner == OtherNode:
		return d.Domain, fmt.Errorf("%s: %w (another node's on this libvirtd)", id, vmruntime.ErrForeign)
	case !d.Owned:
		return d.Domain, fmt.Errorf("%s: %w", id, vmruntime.ErrForeign)
	}
	return d.Domain, nil
}

// Ensure has the helper define m from the held signed section when no
// owned domain has m's definition.
func (r *Runtime) Ensure(ctx context.Context, m vmruntime.Machine) (bool, error) {
	d, err := r.look(ctx, m.ID)
	switch {
	case errors.Is(err, vmruntime.ErrNotFound):
	case err != nil:
		return false, err
	case d.Machine.Equal(m) || sameWithoutGPUs(d.Machine, m):
		return false, nil
	}
	if r.cfg.Signed == nil {
		return false, errors.New("no signed instances section to define the domain from")
	}
	section, proof, err := r.cfg.Signed(m)
	if err != nil {
		return false, err
	}
	p, err := json.Marshal(proof)
	if err != nil {
		return false, err
	}
	if err := r.do(ctx, &wire.Request{V: wire.Version, Op: wire.OpLibvirtDefine, ID: m.ID, Section: section, Proof: p}); err != nil {
		return false, err
	}
	return true, nil
}

// sameWithoutGPUs: GPUs are not read back from a definition, so a
// machine with GPUs compares by the rest.
func sameWithoutGPUs(have, want vmruntime.Machine) bool {
	want.GPUs = nil
	return len(have.GPUs) == 0 && have.Equal(want)
}

// SetState moves an owned domain to state through the helper.
func (r *Runtime) SetState(ctx context.Context, id, state string) error {
	if !vmruntime.ValidState(state) {
		return fmt.Errorf("state %q is not RUNNING, PAUSED or STOPPED", state)
	}
	d, err := r.look(ctx, id)
	if err != nil {
		return err
	}
	var ops []string
	switch {
	case d.State == state:
	case state == vmruntime.Stopped:
		ops = []string{wire.OpLibvirtDestroy}
	case state == vmruntime.Running && d.State == vmruntime.Paused:
		ops = []string{wire.OpLibvirtResume}
	case state == vmruntime.Running:
		ops = []string{wire.OpLibvirtStart}
	case d.State == vmruntime.Stopped: // to PAUSED
		ops = []string{wire.OpLibvirtStart, wire.OpLibvirtSuspend}
	default: // RUNNING to PAUSED
		ops = []string{wire.OpLibvirtSuspend}
	}
	for _, op := range ops {
		if err := r.do(ctx, &wire.Request{V: wire.Version, Op: op, ID: id}); err != nil {
			return err
		}
	}
	return nil
}

// Destroy powers off and undefines an owned domain; none is success.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if _, err := r.look(ctx, id); errors.Is(err, vmruntime.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	for _, op := range []string{wire.OpLibvirtDestroy, wire.OpLibvirtUndefine} {
		if err := r.do(ctx, &wire.Request{V: wire.Version, Op: op, ID: id}); err != nil {
			return err
		}
	}
	return nil
}

// do sends req; the helper's refusals of a foreign or missing domain
// come back as ErrForeign and ErrNotFound.
func (r *Runtime) do(ctx context.Context, req *wire.Request) error {
	_, err := r.cfg.Helper.Do(ctx, req)
	var he *helperclient.Error
	if errors.As(err, &he) {
		switch {
		case strings.Contains(he.Msg, vmruntime.ErrForeign.Error()):
			return fmt.Errorf("%w (%v)", vmruntime.ErrForeign, err)
		case strings.Contains(he.Msg, vmruntime.ErrNotFound.Error()):
			return fmt.Errorf("%w (%v)", vmruntime.ErrNotFound, err)
		}
	}
	return err
}

// SaveMemory has the helper save an owned running or paused domain's
// memory (libvirt.save): the domain stops, its memory is the node's
// file memory.save in the instance's directory, and starting the domain
// resumes it from root's own saved state.
func (r *Runtime) SaveMemory(ctx context.Context, id string) error {
	if _, err := r.look(ctx, id); err != nil {
		return err
	}
	return r.do(ctx, &wire.Request{V: wire.Version, Op: wire.OpLibvirtSave, ID: id})
}

// RestoreMemory has the helper resume m's defined, stopped domain from
// the saved memory in its directory (libvirt.restore), with the held
// signed section and its proof: root renders the domain from the
// section, as for libvirt.define.
func (r *Runtime) RestoreMemory(ctx context.Context, m vmruntime.Machine) error {
	if r.cfg.Signed == nil {
		return errors.New("no signed instances section to restore the domain from")
	}
	section, proof, err := r.cfg.Signed(m)
	if err != nil {
		return err
	}
	p, err := json.Marshal(proof)
	if err != nil {
		return err
	}
	return r.do(ctx, &wire.Request{V: wire.Version, Op: wire.OpLibvirtRestore, ID: m.ID, Section: section, Proof: p})
}

// AttachIdentity has the helper hot-add the instance's identity disk
// (identity.iso in its directory) to its running domain as vdz
// (libvirt.attach-disk).
func (r *Runtime) AttachIdentity(ctx context.Context, id string) error {
	if _, err := r.look(ctx, id); err != nil {
		return err
	}
	return r.do(ctx, &wire.Request{V: wire.Version, Op: wire.OpLibvirtAttachDisk, ID: id})
}
