package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/seal"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// SecretDiscoveryToken is the secret a site agent asks for while it runs
// boot.prepareRamdisk: a one-use join token of role ramdisk, bound to the
// machine's MAC and to that command.
const SecretDiscoveryToken = "discovery-token"

// SecretHTTPHeader prefixes site.httpProxy's secret headers:
// http-header/<Canonical-Name>.
const SecretHTTPHeader = "http-header/"

// DiscoveryTokenTTL is how long a discovery token stays usable.
const DiscoveryTokenTTL = time.Hour

// AnswerSecret answers a SecretRequest. Secrets are bound to a workflow
// step: the request names the command that needs it, which must be this
// node's, still running, and of a kind that may ask for that secret.
func (s *Fleet) AnswerSecret(l *hub.Live, req *bcdv1.SecretRequest) *bcdv1.GatewayFrame {
	ans := &bcdv1.SecretAnswer{RequestId: req.GetRequestId()}
	var val []byte
	err := seal.VerifyRequest(l.NodeKey, l.NodeID, req)
	if err == nil {
		val, err = s.secret(l, req)
	}
	if err == nil {
		ans.Sealed, err = seal.Seal(req, val, s.now())
	}
	if err != nil {
		ans.Error = err.Error()
		s.log.Warn("secret refused", "node", l.NodeID, "name", req.GetName(), "command_id", req.GetCommandId(), "reason", err.Error())
	} else {
		s.log.Info("secret answered", "node", l.NodeID, "name", req.GetName(), "command_id", req.GetCommandId())
	}
	return &bcdv1.GatewayFrame{Frame: &bcdv1.GatewayFrame_SecretAnswer{SecretAnswer: ans}}
}

func (s *Fleet) secret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	if req.GetName() == secretBMCCredentials || req.GetName() == secretBMCNewPassword {
		return s.bmcSecret(l, req)
	}
	if req.GetName() == SecretProvisionedToken || req.GetName() == SecretUserData {
		return s.provisionSecret(l, req)
	}
	if strings.HasPrefix(req.GetName(), SecretHTTPHeader) {
		return s.headerSecret(l, req)
	}
	if strings.HasPrefix(req.GetName(), SecretTelemetryHeader) {
		return s.telemetrySecret(l, req)
	}
	if strings.HasPrefix(req.GetName(), SecretInstanceUserData) {
		return s.userDataSecret(l, req)
	}
	if req.GetName() != SecretDiscoveryToken {
		return nil, fmt.Errorf("no secret %q", req.GetName())
	}
	if l.Role != "site" {
		return nil, errors.New("only a site agent may ask for a discovery token")
	}
	c, err := s.store.Command(req.GetCommandId())
	if err != nil || c.NodeID != l.NodeID || c.Kind != "boot.prepareRamdisk" || c.State == store.StateDone {
		return nil, errors.New("the secret is bound to a running boot.prepareRamdisk command of this site agent")
	}
	var body struct {
		MAC string `json:"mac"`
	}
	_ = json.Unmarshal(c.Body, &body)
	mac, err := net.ParseMAC(body.MAC)
	if err != nil || len(mac) != 6 {
		return nil, errors.New("the command names no MAC")
	}
	n, err := s.store.Node(l.NodeID)
	if err != nil {
		return nil, err
	}
	tok, err := s.commandToken(c.ID, store.Token{Role: "ramdisk", Site: n.Site, Uses: 1,
		ExpiresAt: s.now().Add(DiscoveryTokenTTL).UTC(), MAC: mac.String(), Command: c.ID})
	if err != nil {
		return nil, err
	}
	return []byte(tok), nil
}

// headerSecret answers a site.httpProxy's secret header: only to the site
// agent running that command, only a header sent with it.
func (s *Fleet) headerSecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	if l.Role != "site" {
		return nil, errors.New("only a site agent may ask for a secret header")
	}
	c, err := s.store.Command(req.GetCommandId())
	if err != nil || c.NodeID != l.NodeID || c.Kind != "site.httpProxy" || c.State == store.StateDone {
		return nil, errors.New("a secret header is bound to a running site.httpProxy command of this site agent")
	}
	v, _ := s.store.Meta(commandKey(c.ID, "secret/"+req.GetName()))
	if len(v) == 0 {
		return nil, fmt.Errorf("the command was sent without the secret header %s", strings.TrimPrefix(req.GetName(), SecretHTTPHeader))
	}
	return v, nil
}

// commandKey names state the gateway keeps for one command in its meta
// bucket (its secrets, the id of its live token); all of it is dropped
// when the command's result is stored.
func commandKey(cmdID, what string) string { return "cmd/" + cmdID + "/" + what }

// commandToken mints t as the one live token of command cmdID: a re-request
// while the command runs replaces the token minted before. The token
// outlives the command (the machine it is for boots later).
func (s *Fleet) commandToken(cmdID string, t store.Token) (string, error) {
	key := commandKey(cmdID, "token")
	if old, _ := s.store.Meta(key); len(old) > 0 {
		_ = s.store.DeleteToken(string(old))
	}
	tok, rec, err := s.mintToken(t)
	if err != nil {
		return "", err
	}
	if err := s.store.SetMeta(key, []byte(rec.ID)); err != nil {
		return "", err
	}
	return tok, nil
}

// dropCommandState forgets what the gateway kept for a finished command:
// its secrets (deploy.image's user data) do not outlive it.
func (s *Fleet) dropCommandState(cmdID string) {
	if err := s.store.DeleteMetaPrefix("cmd/" + cmdID + "/"); err != nil {
		s.log.Warn("dropping a finished command's secrets failed", "command_id", cmdID, "err", err)
	}
}
