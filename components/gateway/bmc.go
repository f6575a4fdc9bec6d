package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/better-compute/bcd/components/gateway/hub"
	"github.com/better-compute/bcd/components/gateway/store"
	bcdv1 "github.com/better-compute/bcd/proto/gen/bcd/v1"
)

// BMC credentials are kept in bcgw's store (a lab gateway: in plain form,
// in its 0600 database) and handed to a site agent only as the secret of a
// running bmc.* command of that agent that names the BMC.

// BMCCredentials are a BMC's login and its enrolment options.
type BMCCredentials struct {
	Username string `json:"username"`
	Password string `json:"password"`
	// LegacyTLS allows bmc.* commands that reach the BMC with legacy TLS
	// (TLS 1.2 with RSA key exchange, "bmc.legacy_tls" in the body): the
	// credentials are released to such a command only when this is set.
	LegacyTLS bool `json:"legacy_tls,omitempty"`
}

const (
	secretBMCCredentials = "bmc-credentials"
	secretBMCNewPassword = "bmc-new-password"
)

func bmcKey(addr string) string { return "bmc/" + strings.ToLower(addr) }

// SetBMCCredentials stores a BMC's credentials.
func (s *Server) SetBMCCredentials(addr string, c BMCCredentials) error {
	if addr == "" || c.Username == "" || c.Password == "" {
		return errors.New("address, username and password are required")
	}
	b, _ := json.Marshal(c)
	return s.store.SetMeta(bmcKey(addr), b)
}

// bmcCommand returns the running bmc.* command a secret is asked for and
// the BMC address it names.
func (s *Server) bmcCommand(l *hub.Live, req *bcdv1.SecretRequest) (store.Command, string, error) {
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

func (s *Server) bmcSecret(l *hub.Live, req *bcdv1.SecretRequest) ([]byte, error) {
	c, addr, err := s.bmcCommand(l, req)
	if err != nil {
		return nil, err
	}
	switch req.GetName() {
	case secretBMCCredentials:
		b, err := s.store.Meta(bmcKey(addr))
		var cur BMCCredentials
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
		pw := randomID(20)
		if err := s.store.SetMeta("bmcpending/"+c.ID, []byte(pw)); err != nil {
			return nil, err
		}
		return []byte(pw), nil
	}
	return nil, fmt.Errorf("no secret %q", req.GetName())
}

// bmcResult commits a rotated password once bmc.rotateCredentials
// succeeded (the BMC then only takes the new one).
func (s *Server) bmcResult(c store.Command, status string) {
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
	var cur BMCCredentials
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

func (s *Server) adminBMC(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Address   string `json:"address"`
		Username  string `json:"username"`
		Password  string `json:"password"`
		LegacyTLS bool   `json:"legacy_tls"`
	}
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if err := s.SetBMCCredentials(req.Address, BMCCredentials{Username: req.Username, Password: req.Password, LegacyTLS: req.LegacyTLS}); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if req.LegacyTLS {
		s.log.Warn("BMC enrolled with legacy TLS (TLS 1.2 with RSA key exchange, no forward secrecy)", "bmc", req.Address)
	}
	writeJSON(w, map[string]any{"address": req.Address, "legacy_tls": req.LegacyTLS})
}
