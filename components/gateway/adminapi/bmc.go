package adminapi

// BMCCredentials are a BMC's login and its enrolment options.
type BMCCredentials struct {
	Username string `json:"username"`
	Password string `json:"password"`
	// LegacyTLS allows bmc.* commands that reach the BMC with legacy TLS
	// (TLS 1.2 with RSA key exchange, "bmc.legacy_tls" in the body): the
	// credentials are released to such a command only when this is set.
	LegacyTLS bool `json:"legacy_tls,omitempty"`
}
