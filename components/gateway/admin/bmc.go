package admin

import (
	"net/http"

	"github.com/better-compute/bcd/components/gateway/adminapi"
)

// BMC credentials are kept in bcgw's store (a lab gateway: in plain form,
// in its 0600 database) and handed to a site agent only as the secret of a
// running bmc.* command of that agent that names the BMC.

func (s *API) adminBMC(w http.ResponseWriter, r *http.Request) {
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
	if err := s.SetBMCCredentials(req.Address, adminapi.BMCCredentials{Username: req.Username, Password: req.Password, LegacyTLS: req.LegacyTLS}); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if req.LegacyTLS {
		s.log.Warn("BMC enrolled with legacy TLS (TLS 1.2 with RSA key exchange, no forward secrecy)", "bmc", req.Address)
	}
	writeJSON(w, map[string]any{"address": req.Address, "legacy_tls": req.LegacyTLS})
}
