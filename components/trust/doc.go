// Package trust groups what makes an agent and a gateway trust each
// other: pki (keys, pins, purpose-framed signatures, the CA, pinned TLS),
// tpm (the node key in the host's TPM, the AK, EK certificates), identity
// (the joined identity on disk), join (admission to the fleet) and
// wellknown (the control plane's pinned discovery document).
//
// It may import only base. The agent, the helper, the gateway and the
// other domains build on it; it never reaches back into them.
package trust
