package update

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/better-compute/bcd/components/agent/converge"
	"github.com/better-compute/bcd/components/trust/release"
)

// SectionName is the desired-state section of self-update.
const SectionName = "daemon"

// DaemonSpec is the daemon section: the version the agent should run
// and the signed release that names it (the document, or where to
// fetch it). An empty section asks for nothing.
type DaemonSpec struct {
	Version    string          `json:"version,omitempty"`
	Release    json.RawMessage `json:"release,omitempty"`
	ReleaseURL string          `json:"release_url,omitempty"`
}

var versionRe = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]{1,64})?$`)

// DecodeSpec decodes and checks a daemon section strictly.
func DecodeSpec(body json.RawMessage) (DaemonSpec, error) {
	var d DaemonSpec
	if err := converge.DecodeSection(body, &d); err != nil {
		return d, err
	}
	switch {
	case d.Version == "" && (len(d.Release) > 0 || d.ReleaseURL != ""):
		return d, errors.New("daemon: a release needs its version")
	case d.Version == "":
	case !versionRe.MatchString(d.Version):
		return d, fmt.Errorf("daemon: version %q is not MAJOR.MINOR.PATCH[-pre]", d.Version)
	case len(d.Release) == 0 && d.ReleaseURL == "":
		return d, errors.New("daemon: give the signed release (release) or where to fetch it (release_url)")
	case len(d.Release) > 0 && d.ReleaseURL != "":
		return d, errors.New("daemon: give release or release_url, not both")
	}
	return d, nil
}

// Section is the daemon section over an Agent: converged when the
// running binary is the section's version; otherwise Apply upgrades
// (as daemon.upgrade does) and restarts, and the new binary finds it
// converged. A refusal no retry changes fails the section for its
// generation.
type Section struct{ A *Agent }

// Section returns the daemon section of a.
func (a *Agent) Section() *Section { return &Section{A: a} }

// Name implements converge.Section.
func (s *Section) Name() string { return SectionName }

// Check implements converge.Section.
func (s *Section) Check(body json.RawMessage) error { _, err := DecodeSpec(body); return err }

// Plan implements converge.Section.
func (s *Section) Plan(ctx context.Context, body json.RawMessage) (converge.Plan, error) {
	d, err := DecodeSpec(body)
	if err != nil {
		return converge.Plan{}, converge.Terminal(err)
	}
	if d.Version == "" || d.Version == s.A.Version {
		return converge.Plan{}, nil
	}
	st, err := s.A.Installer.Status(ctx)
	if err != nil {
		return converge.Plan{}, err
	}
	for _, f := range st.Failed {
		if f == d.Version {
			return converge.Plan{}, converge.Terminal(fmt.Errorf("daemon: release %s failed before: it is not tried again until bcd update --clear-failed", d.Version))
		}
	}
	return converge.Plan{Changes: []string{fmt.Sprintf("upgrade bcd %s to %s", s.A.Version, d.Version)}, Detail: d}, nil
}

// Apply implements converge.Section.
func (s *Section) Apply(ctx context.Context, body json.RawMessage, p converge.Plan) error {
	d, ok := p.Detail.(DaemonSpec)
	if !ok {
		var err error
		if d, err = DecodeSpec(body); err != nil {
			return converge.Terminal(err)
		}
	}
	if d.Version == "" || d.Version == s.A.Version {
		return nil
	}
	doc, err := s.A.document(ctx, Body{Release: d.Release, ReleaseURL: d.ReleaseURL})
	if err == nil {
		// Unverified, only to compare: Prepare verifies it.
		var man release.Manifest
		if _, man, err = release.Decode(doc); err == nil && man.Version != d.Version {
			err = &release.FinalError{Err: fmt.Errorf("the release is %s, the section asks for %s", man.Version, d.Version)}
		}
	}
	if err != nil {
		return final(fmt.Errorf("daemon: %w", err))
	}
	up, same, err := s.A.Upgrade(ctx, doc, nil, nil)
	if err != nil {
		return final(fmt.Errorf("daemon: %w", err))
	}
	if same {
		return nil
	}
	s.A.log().Info("self-update swapped by the daemon section; restarting into the new release", "version", up.Version, "deadline", up.Deadline)
	s.A.doRestart()
	<-ctx.Done()
	return ctx.Err()
}

// final marks a release.FinalError terminal for the converge engine.
func final(err error) error {
	var fe *release.FinalError
	if errors.As(err, &fe) {
		return converge.Terminal(err)
	}
	return err
}
