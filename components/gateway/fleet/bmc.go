package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

const (
	secretBMCCredentials = "bmc-credentials"
	secretBMCNewPassword = "bmc-new-password"
)

func bmcKey(addr string) string { return "bmc/" + strings.ToLower(addr) }

// SetBMCCredentials stores a BMC's credentials.
func (s *Fleet) SetBMCCredentials(addr string, c adminapi.BMCCredentials) error {
	if addr == "" || c.Username == "" || c.Password == "" {
		return errors.New("address, username and password are required")
	}
	b, _ := json.Marshal(c)
	return s.store.SetMeta(bmcKey(addr), b)
}

// bmcCommand returns the running bmc.* command a secret is asked for and
// the BMC address it names.
func (s *Fleet) bmcCommand(l *hub.Live, req *bcdv1.SecretRequest) (store.Command, string, error) {
	c, err := s.store.Command(req.GetCommandId())
	if err != nil || c.NodeID != l.NodeID || !strings.HasPrefix(c.Kind, "bmc.") || c.State == store.StateDone || l.Role != "site" {
		return c, "", errors.New("the secret is bound to a running bmc.* command of this site agent")
	}
	addr := bmcAddress(c.Body)
	if addr == "" {
		return c, "", errors.New("the command names no BMC")
	}
	return c, addr, nil
}

// bmcAddress is the BMC address a bmc.* command body names.
func bmcAddress(body []byte) string {
	var b struct {
		BMC struct {
			Address string `json:"address"`
		} `json:"bmc"`
	}
	_ = json.Unmarshal(body, &b)
	return b.BMC.Address
}

// bmcLegacyTLS reports whether a bmc.* command body asks for legacy TLS.
func bmcLegacyTLS(body []byte) bool {
	var b struct {
		BMC struct {
			LegacyTLS bool `json:"legacy_tls"`
		} `json:"bmc"`
	}
	_ = json.Unmarshal(body, &b)
	return b.BMC.LegacyTLS
}

func (s *Fleet) bmcSecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	c, addr, err := s.bmcCommand(l, req)
	if err != nil {
		return nil, err
	}
	switch req.GetName() {
	case secretBMCCredentials:
		b, err := s.store.Meta(bmcKey(addr))
		var cur adminapi.BMCCredentials
		if err != nil || len(b) == 0 || json.Unmarshal(b, &cur) != nil {
			return nil, fmt.Errorf("no credentials for BMC %s (bcgw bmc-credentials --address %s)", addr, addr)
		}
		if bmcLegacyTLS(c.Body) && !cur.LegacyTLS {
			return nil, fmt.Errorf("BMC %s is not enrolled for legacy TLS, so its credentials do not travel over it (bcgw bmc-credentials --address %s --legacy-tls)", addr, addr)
		}
		// The agent takes exactly the login, never the enrolment options.
		return json.Marshal(map[string]string{"username": cur.Username, "password": cur.Password})
	case secretBMCNewPassword:
		if c.Kind != "bmc.rotateCredentials" {
			return nil, errors.New("a new password is only for bmc.rotateCredentials")
		}
		pw := RandomID(20)
		if err := s.store.SetMeta("bmcpending/"+c.ID, []byte(pw)); err != nil {
			return nil, err
		}
		return []byte(pw), nil
	}
	return nil, fmt.Errorf("no secret %q", req.GetName())
}

// BMCResult commits a rotated password once bmc.rotateCredentials
// succeeded (the BMC then only takes the new one).
func (s *Fleet) BMCResult(c store.Command, status string) {
	if c.Kind != "bmc.rotateCredentials" {
		return
	}
	pw, _ := s.store.Meta("bmcpending/" + c.ID)
	_ = s.store.SetMeta("bmcpending/"+c.ID, nil)
	if status != "SUCCEEDED" || len(pw) == 0 {
		return
	}
	addr := bmcAddress(c.Body)
	b, _ := s.store.Meta(bmcKey(addr))
	var cur adminapi.BMCCredentials
	if json.Unmarshal(b, &cur) != nil {
		return
	}
	cur.Password = string(pw)
	if err := s.SetBMCCredentials(addr, cur); err != nil {
		s.log.Error("storing a rotated BMC password failed", "bmc", addr, "err", err)
		return
	}
	s.log.Info("BMC password rotated", "bmc", addr, "command_id", c.ID)
}
