// Package fleet is the gateway's fleet logic: join tokens and
// provisioning, commands and their results, desired specs and GPU holds,
// quorum batches, the trust bundle and its approvers, releases, TPM
// enrolment, SSH access, and the notices the gateways on one database
// exchange. It stands on the store (package store) and the keys (package
// keys) and reaches live sessions through package hub; the agent service
// (package agentsvc) and the admin API (package admin) call it, never the
// other way round.
package fleet
