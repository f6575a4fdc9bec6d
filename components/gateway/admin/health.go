package admin

import "net/http"

// The gateway's own health: whether its database answers. A gateway
// whose database is lost can hold sessions but store nothing, so every
// call of its agents fails after opTimeout. It says so three ways
// (docs/gateway-store.md, "A database lost while serving"): a log line
// when the database stops and starts answering, `bcgw health` on the
// admin API with the error, and GET /readyz on the agents' port, which a
// balancer's health check reads to send agents to another gateway.

func (s *API) adminHealth(w http.ResponseWriter, r *http.Request) { writeJSON(w, s.Health()) }
