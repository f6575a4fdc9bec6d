package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// The secrets a ramdisk asks for while it runs deploy.image.
const (
	// SecretProvisionedToken is a one-use join token of role node bound to
	// the node id the command's "os" section names: the installed OS joins
	// with it (`bcd join --node-id`, the provisioned attestor).
	SecretProvisionedToken = "provisioned-token"
	// SecretUserData is the command's user data (cloud-init NoCloud or
	// Ignition), given to `bcgw run --user-data` and stored with the
	// command, never in its body.
	SecretUserData = "user-data"
)

// ProvisionedTokenTTL is how long an installed OS has to boot and join.
const ProvisionedTokenTTL = 24 * time.Hour

// MaxUserData bounds deploy.image's user data.
const MaxUserData = 256 << 10

// ValidNodeID checks a node id an operator names.
func ValidNodeID(id string) error {
	if !adminapi.NodeIDPattern.MatchString(id) {
		return fmt.Errorf("node id %q must be 1 to 63 of a-z, 0-9, _ and -, starting with a letter or digit", id)
	}
	return nil
}

// NewProvisionedToken mints a one-use token with which an installed OS
// joins as node nodeID (`bcd join --node-id`): what deploy.image gets
// through SecretProvisionedToken, made by hand for an OS installed some
// other way. An existing node of that id is replaced when it joins.
func (s *Fleet) NewProvisionedToken(site, nodeID string, ttl time.Duration) (string, store.Token, error) {
	if err := s.provisionable(nodeID); err != nil {
		return "", store.Token{}, err
	}
	if site == "" {
		site = "lab"
	}
	if ttl <= 0 {
		ttl = ProvisionedTokenTTL
	}
	tok, t, err := s.mintToken(provisionedToken(site, nodeID, ttl, s.now()))
	if err != nil {
		return "", t, err
	}
	s.log.Info("provisioned token created", "token_id", t.ID, "site", site, "node", nodeID)
	return tok, t, nil
}

// provisionable checks a node id an installed OS may join as: well formed,
// and not an agent of another role.
func (s *Fleet) provisionable(nodeID string) error {
	if err := ValidNodeID(nodeID); err != nil {
		return err
	}
	if n, err := s.store.Node(nodeID); err == nil && n.Role != "node" {
		return fmt.Errorf("node id %s is a %s's", n.ID, n.Role)
	}
	return nil
}

// provisionedToken is a one-use token of role node bound to nodeID.
func provisionedToken(site, nodeID string, ttl time.Duration, now time.Time) store.Token {
	return store.Token{Role: "node", Site: site, Uses: 1, ExpiresAt: now.Add(ttl).UTC(), NodeID: nodeID}
}

func (s *Fleet) putCommandSecret(cmdID, name string, v []byte) error {
	return s.store.SetMeta(commandKey(cmdID, "secret/"+name), v)
}

// provisionSecret answers a ramdisk's SecretRequest for a running
// deploy.image command of its own.
func (s *Fleet) provisionSecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	if l.Role != "ramdisk" {
		return nil, fmt.Errorf("only a ramdisk may ask for %s", req.GetName())
	}
	c, err := s.store.Command(req.GetCommandId())
	if err != nil || c.NodeID != l.NodeID || c.Kind != "deploy.image" || c.State == store.StateDone {
		return nil, fmt.Errorf("%s is bound to a running deploy.image command of this ramdisk", req.GetName())
	}
	if req.GetName() == SecretUserData {
		v, _ := s.store.Meta(commandKey(c.ID, "secret/"+SecretUserData))
		if len(v) == 0 {
			return nil, errors.New("the command was sent without user data")
		}
		return v, nil
	}
	var body struct {
		OS struct {
			NodeID string `json:"node_id"`
		} `json:"os"`
	}
	_ = json.Unmarshal(c.Body, &body)
	if body.OS.NodeID == "" {
		return nil, errors.New(`the command's "os" section names no node_id`)
	}
	if err := s.provisionable(body.OS.NodeID); err != nil {
		return nil, err
	}
	ramdisk, err := s.store.Node(l.NodeID)
	if err != nil {
		return nil, err
	}
	t := provisionedToken(ramdisk.Site, body.OS.NodeID, ProvisionedTokenTTL, s.now())
	t.Command = c.ID
	tok, err := s.commandToken(c.ID, t)
	if err != nil {
		return nil, err
	}
	return []byte(tok), nil
}

// ProvisionedBinding ties the provisioned attestor to provisioned tokens:
// such a token admits only that attestor, and other tokens never take it.
// It is checked before the token's use is counted.
func ProvisionedBinding(attestor string, tok store.Token) error {
	switch {
	case attestor == "provisioned" && tok.NodeID == "":
		return errors.New("the provisioned attestor needs a token minted for deploy.image")
	case attestor != "provisioned" && tok.NodeID != "":
		return errors.New("a provisioned token joins only with the provisioned attestor (bcd join --node-id)")
	}
	return nil
}

// CheckProvisioned makes a provisioned join the node its token names
// (replacing an earlier record of that node, whose disk the deploy
// overwrote).
func (s *Fleet) CheckProvisioned(attestor string, tok store.Token, n *store.Node) error {
	if err := ProvisionedBinding(attestor, tok); err != nil || tok.NodeID == "" {
		return err
	}
	if old, err := s.store.Node(tok.NodeID); err == nil {
		if old.Role != "node" {
			return fmt.Errorf("node id %s is a %s's", old.ID, old.Role)
		}
		s.log.Info("provisioned join replaces an earlier record of the node", "node", old.ID, "old_cert_serial", old.CertSerial)
	}
	n.ID = tok.NodeID
	return nil
}
