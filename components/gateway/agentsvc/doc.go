// Package agentsvc is the gateway's agent-facing service: the
// AgentGateway RPCs (Join with its attestors, Renew, the Session stream,
// Tunnel), the TLS admission in front of them, the join rate limit and
// the readiness check a balancer reads. It registers live sessions in
// package hub and calls the fleet logic (package fleet) for everything it
// stores.
package agentsvc
