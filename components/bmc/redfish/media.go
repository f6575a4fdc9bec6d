package redfish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Virtual media as vendors implement it. A system's CD may sit under the
// system or under a manager; a manager may list several slots of which only
// some take a CD image; a slot may advertise InsertMedia yet answer 404 or
// 405 for it; older Supermicro boards have no standard slot at all, only
// their OEM IsoConfig resource. The client tries every eligible slot in
// the collection's order and, when none takes the image, the OEM resource.

// virtualMedia is what the client reads of a VirtualMedia resource.
type virtualMedia struct {
	path       string
	etag       string
	ID         string    `json:"Id"`
	MediaTypes *[]string `json:"MediaTypes"`
	Image      string    `json:"Image"`
	Inserted   flexBool  `json:"Inserted"`
	Actions    struct {
		Insert struct {
			Target string `json:"target"`
		} `json:"#VirtualMedia.InsertMedia"`
		Eject struct {
			Target string `json:"target"`
		} `json:"#VirtualMedia.EjectMedia"`
	} `json:"Actions"`
}

// parseVirtualMedia decodes a VirtualMedia body.
func parseVirtualMedia(b []byte) (*virtualMedia, error) {
	var vm virtualMedia
	if err := decode(b, &vm); err != nil {
		return nil, fmt.Errorf("virtual media: %w", err)
	}
	return &vm, nil
}

// takesCD reports whether a slot can take a CD image: it lists CD or DVD
// among its MediaTypes, or it lists no MediaTypes at all but advertises
// InsertMedia (several BMCs omit the property on slots that work).
func (vm *virtualMedia) takesCD() bool {
	if vm.MediaTypes == nil || len(*vm.MediaTypes) == 0 {
		return vm.Actions.Insert.Target != ""
	}
	return slices.Contains(*vm.MediaTypes, "CD") || slices.Contains(*vm.MediaTypes, "DVD")
}

// smcIsoConfig is the OEM virtual media of older Supermicro boards
// (Managers/<id>/VM1/CfgCD): the image's Host (scheme://host[:port]) and
// Path are PATCHed, then the IsoConfig.Mount action mounts it.
type smcIsoConfig struct {
	path    string
	etag    string
	Host    string `json:"Host"`
	Path    string `json:"Path"`
	Actions struct {
		Mount struct {
			Target string `json:"target"`
		} `json:"#IsoConfig.Mount"`
		UnMount struct {
			Target string `json:"target"`
		} `json:"#IsoConfig.UnMount"`
	} `json:"Actions"`
}

// managerMedia is what the client reads of a Manager for virtual media.
type managerMedia struct {
	VirtualMedia link `json:"VirtualMedia"`
	Oem          struct {
		Supermicro struct {
			VirtualMediaConfig link `json:"VirtualMediaConfig"`
		} `json:"Supermicro"`
	} `json:"Oem"`
}

// parseManagerMedia decodes the virtual media links of a Manager body.
func parseManagerMedia(b []byte) (*managerMedia, error) {
	var m managerMedia
	if err := decode(b, &m); err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	return &m, nil
}

// mediaPlaces are the slots that take a CD, in the collection's order, and
// the Supermicro OEM resource ("" when no manager names one).
type mediaPlaces struct {
	slots []*virtualMedia
	oem   string
}

// findMedia reads the virtual media collection of the system, else that of
// the manager that manages it, else of the first manager that has one, and
// keeps the slots that take a CD. The managers are also searched for the
// Supermicro OEM resource. A slot whose GET answers 404 is skipped.
func (c *Client) findMedia(ctx context.Context) (*mediaPlaces, error) {
	s, _, err := c.getSystem(ctx)
	if err != nil {
		return nil, err
	}
	coll := s.VirtualMedia.ID
	out := &mediaPlaces{}
	var managers []string
	for _, m := range s.Links.ManagedBy {
		managers = append(managers, m.ID)
	}
	all, err := c.members(ctx, c.root.Managers.or(Root+"/Managers"))
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, m := range append(managers, all...) {
		if seen[m] {
			continue
		}
		seen[m] = true
		r, err := c.get(ctx, m)
		if notThere(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		mgr, err := parseManagerMedia(r.body)
		if err != nil {
			return nil, fmt.Errorf("redfish: GET %s: %w", printable(m), err)
		}
		if coll == "" {
			coll = mgr.VirtualMedia.ID
		}
		if out.oem == "" {
			out.oem = mgr.Oem.Supermicro.VirtualMediaConfig.ID
		}
		if coll != "" && out.oem != "" {
			break
		}
	}
	if coll == "" {
		return out, nil
	}
	paths, err := c.members(ctx, coll)
	if err != nil {
		if out.oem != "" && notThere(err) {
			return out, nil // a VM1 that is no collection: only the OEM resource works
		}
		return nil, err
	}
	for _, p := range paths {
		vm, err := c.readSlot(ctx, p)
		if notThere(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if vm.takesCD() {
			out.slots = append(out.slots, vm)
		}
	}
	return out, nil
}

func (c *Client) readSlot(ctx context.Context, p string) (*virtualMedia, error) {
	r, err := c.get(ctx, p)
	if err != nil {
		return nil, err
	}
	vm, err := parseVirtualMedia(r.body)
	if err != nil {
		return nil, fmt.Errorf("redfish: GET %s: %w", printable(p), err)
	}
	vm.path, vm.etag = p, etagOf(r)
	return vm, nil
}

// notThere: 404 (no such resource) or 405 (no such method there), what a
// BMC answers for an action or a resource it advertises but lacks.
func notThere(err error) bool {
	s := StatusOf(err)
	return s == http.StatusNotFound || s == http.StatusMethodNotAllowed
}

func errNoMedia() error {
	return errors.New("redfish: neither the system nor its managers offer virtual media that takes a CD image")
}

// InsertMedia inserts the image at imageURL into the first slot that takes
// it, ejecting what that slot held first. A slot whose insert (or eject)
// answers 404 or 405 is passed over for the next; after the last, the
// Supermicro OEM virtual media is tried when a manager names it.
func (c *Client) InsertMedia(ctx context.Context, imageURL string) error {
	if err := ValidImageURL(imageURL); err != nil {
		return fmt.Errorf("redfish: %w", err)
	}
	places, err := c.findMedia(ctx)
	if err != nil {
		return err
	}
	var passed []string
	for _, vm := range places.slots {
		err := c.insertSlot(ctx, vm, imageURL)
		if err == nil {
			return nil
		}
		if !notThere(err) {
			return err
		}
		passed = append(passed, fmt.Sprintf("%s (%d)", printable(vm.path), StatusOf(err)))
	}
	if places.oem != "" {
		return c.smcInsert(ctx, places.oem, imageURL)
	}
	if len(passed) == 0 {
		return errNoMedia()
	}
	return fmt.Errorf("redfish: no virtual media slot took the image; tried %s", strings.Join(passed, ", "))
}

func (c *Client) insertSlot(ctx context.Context, vm *virtualMedia, imageURL string) error {
	if vm.Inserted {
		if err := c.mediaAction(ctx, vm, false, ""); err != nil {
			return fmt.Errorf("eject the inserted image of %s first: %w", printable(vm.path), err)
		}
		fresh, err := c.readSlot(ctx, vm.path)
		if err != nil {
			return err
		}
		vm = fresh
	}
	return c.mediaAction(ctx, vm, true, imageURL)
}

// EjectMedia ejects every slot that takes a CD and holds an image, and
// unmounts the Supermicro OEM virtual media when it holds one; nothing to
// do when all are empty.
func (c *Client) EjectMedia(ctx context.Context) error {
	places, err := c.findMedia(ctx)
	if err != nil {
		return err
	}
	if len(places.slots) == 0 && places.oem == "" {
		return errNoMedia()
	}
	for _, vm := range places.slots {
		if vm.Inserted {
			if err := c.mediaAction(ctx, vm, false, ""); err != nil {
				return err
			}
		}
	}
	if places.oem != "" {
		cfg, err := c.smcConfig(ctx, places.oem)
		if err != nil {
			return err
		}
		if cfg.Host != "" || cfg.Path != "" {
			return c.smcUnmount(ctx, cfg)
		}
	}
	return nil
}

// CDMedia reports the first slot taking a CD that holds an image, else
// the first slot taking a CD, else the Supermicro OEM virtual media.
func (c *Client) CDMedia(ctx context.Context) (Media, error) {
	places, err := c.findMedia(ctx)
	if err != nil {
		return Media{}, err
	}
	for _, vm := range places.slots {
		if vm.Inserted {
			return vm.media(), nil
		}
	}
	if len(places.slots) > 0 {
		return places.slots[0].media(), nil
	}
	if places.oem != "" {
		cfg, err := c.smcConfig(ctx, places.oem)
		if err != nil {
			return Media{}, err
		}
		img := cfg.Host + cfg.Path
		return Media{ID: clean(places.oem, 128), Image: clean(img, 2048), Inserted: cfg.Host != "" && cfg.Path != ""}, nil
	}
	return Media{}, errNoMedia()
}

func (vm *virtualMedia) media() Media {
	return Media{ID: clean(vm.ID, 128), Image: clean(vm.Image, 2048), Inserted: bool(vm.Inserted)}
}

// Media is the state of the CD virtual media.
type Media struct {
	ID       string `json:"id"`
	Image    string `json:"image,omitempty"`
	Inserted bool   `json:"inserted"`
}

func (c *Client) smcConfig(ctx context.Context, p string) (*smcIsoConfig, error) {
	r, err := c.get(ctx, p)
	if err != nil {
		return nil, err
	}
	var cfg smcIsoConfig
	if err := decode(r.body, &cfg); err != nil {
		return nil, fmt.Errorf("redfish: GET %s: %w", printable(p), err)
	}
	cfg.path, cfg.etag = p, etagOf(r)
	return &cfg, nil
}

// smcShare splits an image URL into the Host (scheme://host[:port]) and
// Path (path and query) the Supermicro IsoConfig takes.
func smcShare(imageURL string) (host, file string, err error) {
	u, err := url.Parse(imageURL)
	if err != nil {
		return "", "", errors.New("image url: does not parse")
	}
	file = u.EscapedPath()
	if file == "" {
		file = "/"
	}
	if u.RawQuery != "" {
		file += "?" + u.RawQuery
	}
	return u.Scheme + "://" + u.Host, file, nil
}

// smcInsert unmounts what the OEM virtual media holds, PATCHes Host and
// Path and mounts it (the advertised IsoConfig.Mount, else the standard
// path under the resource).
func (c *Client) smcInsert(ctx context.Context, p, imageURL string) error {
	host, file, err := smcShare(imageURL)
	if err != nil {
		return fmt.Errorf("redfish: %w", err)
	}
	cfg, err := c.smcConfig(ctx, p)
	if err != nil {
		return err
	}
	if cfg.Host != "" || cfg.Path != "" {
		if err := c.smcUnmount(ctx, cfg); err != nil && StatusOf(err) != http.StatusBadRequest {
			return fmt.Errorf("unmount the OEM virtual media first: %w", err)
		}
	}
	body, err := json.Marshal(map[string]string{"Host": host, "Path": file})
	if err != nil {
		return err
	}
	if err := c.patch(ctx, p, cfg.etag, body); err != nil {
		return err
	}
	target := cfg.Actions.Mount.Target
	if target == "" {
		target = p + "/Actions/IsoConfig.Mount"
	}
	_, err = c.post(ctx, target, map[string]any{})
	return err
}

func (c *Client) smcUnmount(ctx context.Context, cfg *smcIsoConfig) error {
	target := cfg.Actions.UnMount.Target
	if target == "" {
		target = cfg.path + "/Actions/IsoConfig.UnMount"
	}
	_, err := c.post(ctx, target, map[string]any{})
	return err
}
