package admin

import (
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Named admin tokens: besides the default one bcgw serve writes to
// DATA/admin.token, any number more, each by a name that the audit trail
// records as the actor of what it did. They live in the store (meta
// admin-token/NAME, the secret only as its SHA-256), so every gateway on
// one database takes them, and removing one revokes it at its next use.

const adminTokenPrefix = "admin-token/"

var adminTokenName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

type adminTokenRecord struct {
	Name      string    `json:"name"`
	Hash      string    `json:"hash"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// namedToken is the name of the stored admin token whose secret is got.
func (s *API) namedToken(got string) (string, bool) {
	recs, err := s.store.MetaPrefix(adminTokenPrefix)
	if err != nil {
		s.log.Error("admin tokens not read", "err", err)
		return "", false
	}
	h := []byte(store.HashSecret(got))
	name, ok := "", false
	for _, b := range recs {
		var t adminTokenRecord
		if json.Unmarshal(b, &t) == nil && subtle.ConstantTimeCompare(h, []byte(t.Hash)) == 1 {
			name, ok = t.Name, true
		}
	}
	return name, ok
}

func (s *API) adminCreateAdminToken(w http.ResponseWriter, r *http.Request) {
	var req adminapi.AdminTokenRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	auditTarget(w, req.Name)
	if !adminTokenName.MatchString(req.Name) {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("admin token name %q: want 1 to 64 of a-z 0-9 _ . - starting with a letter or digit", req.Name))
		return
	}
	if req.Name == DefaultTokenName || req.Name == SocketActor {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("admin token name %q is taken by bcgw itself", req.Name))
		return
	}
	secret := fleet.RandomID(32)
	b, err := json.Marshal(adminTokenRecord{Name: req.Name, Hash: store.HashSecret(secret), CreatedAt: s.Now().UTC(), CreatedBy: actorOf(r)})
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	ok, err := s.store.SwapMeta(adminTokenPrefix+req.Name, nil, b)
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	if !ok {
		adminErr(w, http.StatusConflict, fmt.Errorf("an admin token named %s exists (bcgw admin-token rm %s first)", req.Name, req.Name))
		return
	}
	writeJSON(w, adminapi.AdminTokenResponse{Name: req.Name, Token: secret})
}

func (s *API) adminListAdminTokens(w http.ResponseWriter, r *http.Request) {
	recs, err := s.store.MetaPrefix(adminTokenPrefix)
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	out := []adminapi.AdminTokenView{{Name: DefaultTokenName, Default: true}}
	for k, b := range recs {
		var t adminTokenRecord
		if err := json.Unmarshal(b, &t); err != nil {
			adminErr(w, http.StatusInternalServerError, fmt.Errorf("admin token %s: %w", strings.TrimPrefix(k, adminTokenPrefix), err))
			return
		}
		out = append(out, adminapi.AdminTokenView{Name: t.Name, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy})
	}
	sort.Slice(out[1:], func(i, j int) bool { return out[1+i].Name < out[1+j].Name })
	writeJSON(w, out)
}

func (s *API) adminRemoveAdminToken(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if name == DefaultTokenName {
		adminErr(w, http.StatusBadRequest, errors.New("the default admin token is this gateway's own, made anew at every start; run bcgw serve without --admin-listen to have none"))
		return
	}
	if b, err := s.store.Meta(adminTokenPrefix + name); err != nil || b == nil {
		err = cmp.Or(err, store.ErrNotFound)
		adminErr(w, errCode(err, http.StatusInternalServerError), fmt.Errorf("admin token %s: %w (bcgw admin-token ls lists them)", name, err))
		return
	}
	if err := s.store.DeleteMeta(adminTokenPrefix + name); err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, map[string]bool{"removed": true})
}
