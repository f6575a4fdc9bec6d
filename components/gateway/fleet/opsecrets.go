package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/textproto"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/kek"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// Operator secrets are values an operator sets with `bcgw secret set` and
// agents ask for by name with a sealed SecretRequest: today a telemetry
// section's header values (docs/telemetry.md). Each is kept for one node
// or for the fleet, in the store's meta values, sealed under a
// key-encryption key with its store key bound in (so a sealed value
// copied to another node's or name's key does not open): the fleet's KEK
// on a database, on bbolt a KEK file of the data directory made when the
// first secret is set (docs/bcgw.md, "Secrets").

// SecretTelemetryHeader prefixes a telemetry section's header secrets:
// telemetry-header/<Canonical-Name>. The agent asks for them with the
// workflow "telemetry", and only for the headers its spec names.
const SecretTelemetryHeader = "telemetry-header/"

// SecretInstanceUserData prefixes an instance's user data:
// instance-user-data/<allocation>. The node asks for it with the workflow
// "instances", only for an allocation an instance of its spec's instances
// section has with user_data (docs/instances.md, "User data").
const SecretInstanceUserData = "instance-user-data/"

// maxUserData bounds an instance's user data (cloud-init's own bound on
// EC2 is 16 KiB).
const maxUserData = 16 << 10

// secretsKEKFile is the bbolt gateway's key for operator secrets.
const secretsKEKFile = "secrets.kek"

// maxSecretValue bounds an operator secret: a header value, as the agent
// takes it (at most 8 KiB of printable characters).
const maxSecretValue = 8 << 10

// opSecretPrefix starts every operator secret's meta key.
const opSecretPrefix = "opsecret/"

// secretScopeFleet is the scope of a secret for every node.
const secretScopeFleet = "fleet"

// The header names the telemetry exporter sets itself (the agent refuses
// them in a spec too).
var exporterHeaders = []string{"Content-Type", "Content-Length", "Host", "Content-Encoding"}

// CanonicalSecretName checks that name is a secret an operator may set
// and returns it canonical (the header name as net/textproto spells it).
// Errors never hold a value, only the name.
func CanonicalSecretName(name string) (string, error) {
	if a, ok := strings.CutPrefix(name, SecretInstanceUserData); ok {
		if !allocationID(a) {
			return "", fmt.Errorf("secret %q: %q is not an allocation ([A-Za-z0-9][A-Za-z0-9_-], 1 to 128)", trimName(name), trimName(a))
		}
		return name, nil
	}
	h, ok := strings.CutPrefix(name, SecretTelemetryHeader)
	if !ok {
		return "", fmt.Errorf("no settable secret %q: the only ones are %s<Header-Name> (a telemetry section's headers) and %s<allocation> (an instance's user data)",
			trimName(name), SecretTelemetryHeader, SecretInstanceUserData)
	}
	if h == "" || len(h) > 64 || !headerToken(h) {
		return "", fmt.Errorf("secret %q: %q is not an HTTP header name", trimName(name), trimName(h))
	}
	c := textproto.CanonicalMIMEHeaderKey(h)
	if slices.Contains(exporterHeaders, c) {
		return "", fmt.Errorf("secret %q: header %s is the exporter's own", trimName(name), c)
	}
	return SecretTelemetryHeader + c, nil
}

// headerToken reports whether s is an RFC 9110 token (a header name).
func headerToken(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
}

func trimName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// allocationID is an allocation's shape: [A-Za-z0-9][A-Za-z0-9_-], 1 to
// 128 (as the instances section's).
func allocationID(a string) bool {
	if len(a) == 0 || len(a) > 128 || a[0] == '-' || a[0] == '_' {
		return false
	}
	for _, r := range a {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// checkNamedValue checks the value of the secret name: user data is 1 to
// 16 KiB of UTF-8 text; a header value as checkSecretValue says.
func checkNamedValue(name string, v []byte) error {
	if !strings.HasPrefix(name, SecretInstanceUserData) {
		return checkSecretValue(v)
	}
	if len(v) == 0 || len(v) > maxUserData {
		return fmt.Errorf("the user data is %d bytes; it must be 1 to %d", len(v), maxUserData)
	}
	if !utf8.Valid(v) {
		return errors.New("the user data is not UTF-8 text")
	}
	return nil
}

// checkSecretValue refuses what the agent would refuse as a header value,
// and bytes beyond ASCII (JSON would carry them only as UTF-8); the error
// never holds the value.
func checkSecretValue(v []byte) error {
	if len(v) == 0 || len(v) > maxSecretValue {
		return fmt.Errorf("the value is %d bytes; it must be 1 to %d", len(v), maxSecretValue)
	}
	for _, b := range v {
		if b < 0x20 || b > 0x7e {
			return errors.New("the value has a byte that is not printable ASCII (a newline?); a header value is one line of printable ASCII")
		}
	}
	return nil
}

// opSecretKey is the meta key of a secret for node ("": the fleet).
func opSecretKey(name, node string) string {
	scope := secretScopeFleet
	if node != "" {
		scope = "node/" + node
	}
	return opSecretPrefix + scope + "/" + name
}

// secretsKEK is the key operator secrets are sealed under: the fleet's
// KEK on a database; on bbolt the data directory's secrets.kek, made when
// create and it is missing.
func (s *Fleet) secretsKEK(create bool) (*kek.KEK, error) {
	if s.cfg.KEK != nil {
		return s.cfg.KEK, nil
	}
	s.secretsMu.Lock()
	defer s.secretsMu.Unlock()
	if s.secretsKey != nil {
		return s.secretsKey, nil
	}
	path := filepath.Join(s.cfg.DataDir, secretsKEKFile)
	k, err := kek.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		var file []byte
		k, file, err = kek.Generate()
		if err == nil {
			err = atomicfile.Write(path, file, 0o600)
			clear(file)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the secrets' key %s: %w", path, err)
	}
	s.secretsKey = k
	return k, nil
}

// SetSecret stores value as the secret name for node (""
// for the fleet), sealed. The node must exist.
func (s *Fleet) SetSecret(name, node string, value []byte) (string, error) {
	name, err := CanonicalSecretName(name)
	if err != nil {
		return "", err
	}
	if err := checkNamedValue(name, value); err != nil {
		return "", fmt.Errorf("secret %s: %w", name, err)
	}
	if node != "" {
		if _, err := s.store.Node(node); err != nil {
			return "", fmt.Errorf("node %s: %w", node, err)
		}
	}
	if err := s.kekCurrent(); err != nil {
		return "", err
	}
	k, err := s.secretsKEK(true)
	if err != nil {
		return "", err
	}
	key := opSecretKey(name, node)
	sealed, err := k.Seal(key, 1, value)
	if err != nil {
		return "", err
	}
	if err := s.store.SetMeta(key, sealed); err != nil {
		return "", fmt.Errorf("storing secret %s: %w", name, err)
	}
	s.log.Info("secret set", "name", name, "node", node)
	return name, nil
}

// DeleteSecret forgets the secret name of node ("" for the fleet).
func (s *Fleet) DeleteSecret(name, node string) (string, error) {
	name, err := CanonicalSecretName(name)
	if err != nil {
		return "", err
	}
	key := opSecretKey(name, node)
	if v, err := s.store.Meta(key); err != nil || len(v) == 0 {
		return "", fmt.Errorf("no secret %s for %s: %w", name, scopeName(node), store.ErrNotFound)
	}
	if err := s.store.DeleteMeta(key); err != nil {
		return "", err
	}
	s.log.Info("secret deleted", "name", name, "node", node)
	return name, nil
}

// dropNodeSecrets forgets the secrets set for a node that is removed.
func (s *Fleet) dropNodeSecrets(node string) {
	if err := s.store.DeleteMetaPrefix(opSecretPrefix + "node/" + node + "/"); err != nil {
		s.log.Warn("a removed node's secrets were not deleted", "node", node, "err", err)
	}
}

func scopeName(node string) string {
	if node == "" {
		return "the fleet"
	}
	return "node " + node
}

// Secrets lists the operator secrets by name and scope, never a value.
func (s *Fleet) Secrets() ([]adminapi.SecretView, error) {
	m, err := s.store.MetaPrefix(opSecretPrefix)
	if err != nil {
		return nil, err
	}
	out := []adminapi.SecretView{}
	for k, v := range m {
		if len(v) == 0 {
			continue
		}
		rest := strings.TrimPrefix(k, opSecretPrefix)
		var view adminapi.SecretView
		if n, ok := strings.CutPrefix(rest, secretScopeFleet+"/"); ok {
			view.Name = n
		} else if r, ok := strings.CutPrefix(rest, "node/"); ok {
			view.Node, view.Name, _ = strings.Cut(r, "/")
		} else {
			continue
		}
		out = append(out, view)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Node < out[j].Node
	})
	return out, nil
}

// telemetrySecret answers telemetry-header/<Name> to a node or site agent
// whose desired spec's telemetry section names that header: the node's
// own value when one is set, else the fleet's.
func (s *Fleet) telemetrySecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	name, err := CanonicalSecretName(req.GetName())
	if err != nil || name != req.GetName() {
		return nil, fmt.Errorf("no secret %q", trimName(req.GetName()))
	}
	if l.Role != "node" && l.Role != "site" {
		return nil, errors.New("only a node or site agent may ask for a telemetry header")
	}
	if req.GetWorkflowId() != "telemetry" {
		return nil, errors.New("a telemetry header is asked for by the workflow telemetry")
	}
	header := strings.TrimPrefix(name, SecretTelemetryHeader)
	named, err := s.specHeaders(l.NodeID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(named, header) {
		return nil, fmt.Errorf("the node's telemetry section names no header %s", header)
	}
	return s.opSecretValue(name, l.NodeID)
}

// opSecretValue opens the secret name: node's own value when one is
// set, else the fleet's.
func (s *Fleet) opSecretValue(name, nodeID string) ([]byte, error) {
	k, err := s.secretsKEK(false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, noSecret(name, nodeID)
	}
	if err != nil {
		return nil, err
	}
	for _, node := range []string{nodeID, ""} {
		key := opSecretKey(name, node)
		sealed, err := s.store.Meta(key)
		if err != nil {
			return nil, fmt.Errorf("reading secret %s: %w", name, err)
		}
		if len(sealed) == 0 {
			continue
		}
		v, err := k.Open(key, 1, sealed)
		if err != nil {
			if kerr := s.kekCurrent(); kerr != nil {
				err = kerr
			}
			return nil, fmt.Errorf("secret %s of %s: %w", name, scopeName(node), err)
		}
		return v, nil
	}
	return nil, noSecret(name, nodeID)
}

// userDataSecret answers instance-user-data/<allocation> to a node whose
// desired spec's instances section has an instance of that allocation
// with user_data, asked for by the workflow "instances".
func (s *Fleet) userDataSecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	name, err := CanonicalSecretName(req.GetName())
	if err != nil || name != req.GetName() {
		return nil, fmt.Errorf("no secret %q", trimName(req.GetName()))
	}
	if l.Role != "node" {
		return nil, errors.New("only a node agent may ask for an instance's user data")
	}
	if req.GetWorkflowId() != "instances" {
		return nil, errors.New("an instance's user data is asked for by the workflow instances")
	}
	alloc := strings.TrimPrefix(name, SecretInstanceUserData)
	sp, err := s.store.Spec(l.NodeID)
	if err != nil {
		return nil, fmt.Errorf("the node's desired spec: %w", err)
	}
	var spec struct {
		Instances *struct {
			Instances []struct {
				Allocation string `json:"allocation"`
				UserData   bool   `json:"user_data"`
			} `json:"instances"`
		} `json:"instances"`
	}
	if len(sp.Spec) > 0 {
		if err := json.Unmarshal(sp.Spec, &spec); err != nil {
			return nil, fmt.Errorf("the node's desired spec: %w", err)
		}
	}
	named := false
	if spec.Instances != nil {
		for _, in := range spec.Instances.Instances {
			named = named || in.Allocation == alloc && in.UserData
		}
	}
	if !named {
		return nil, fmt.Errorf("no instance of allocation %s in the node's instances section has user_data", alloc)
	}
	return s.opSecretValue(name, l.NodeID)
}

func noSecret(name, node string) error {
	return fmt.Errorf("no secret %s is set for node %s or the fleet (bcgw secret set %s [--node %s] --value-file FILE)", name, node, name, node)
}

// specHeaders are the canonical header names the node's desired spec's
// telemetry section lists.
func (s *Fleet) specHeaders(node string) ([]string, error) {
	sp, err := s.store.Spec(node)
	if err != nil {
		return nil, fmt.Errorf("the node's desired spec: %w", err)
	}
	var spec struct {
		Telemetry *struct {
			Headers []string `json:"headers"`
		} `json:"telemetry"`
	}
	if len(sp.Spec) > 0 {
		if err := json.Unmarshal(sp.Spec, &spec); err != nil {
			return nil, fmt.Errorf("the node's desired spec: %w", err)
		}
	}
	if spec.Telemetry == nil {
		return nil, errors.New("the node's desired spec has no telemetry section")
	}
	var out []string
	for _, h := range spec.Telemetry.Headers {
		out = append(out, textproto.CanonicalMIMEHeaderKey(h))
	}
	return out, nil
}
