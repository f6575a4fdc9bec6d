package admin

import (
	"log/slog"
	"sync"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/agentsvc"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
	"github.com/better-compute/bcd/components/trust/wellknown"
)

// Config is what the admin API needs of a gateway's settings.
type Config struct {
	DataDir string // where the admin socket and the bearer token file are
	// AdminListen, when set, also serves the API on this loopback address
	// with the bearer token in DataDir/admin.token.
	AdminListen string
	// BoundAside, when set, sees the admin socket where it is bound,
	// before it gets its mode and its place (tests).
	BoundAside func(path string)
	// WellKnown is the gateway's well-known document (GET /v1/well-known).
	WellKnown func() (*wellknown.Document, error)
	// RenewServing issues the gateway a new serving leaf now (POST
	// /v1/serving/renew).
	RenewServing func() (adminapi.ServingView, error)
}

// API is the admin API of one gateway: HTTP handlers over its fleet
// logic, and over its agent service for tunnels.
type API struct {
	*fleet.Fleet
	svc   *agentsvc.Service
	cfg   Config
	log   *slog.Logger
	store store.Store

	page pageAuth // the fleet page's one-time links and sessions

	mu    sync.Mutex
	admin string // the loopback admin URL once listening (AdminURL)
}

// New is the admin API over fl and svc.
func New(cfg Config, fl *fleet.Fleet, svc *agentsvc.Service) *API {
	return &API{Fleet: fl, svc: svc, cfg: cfg, log: fl.Log(), store: fl.Store()}
}
