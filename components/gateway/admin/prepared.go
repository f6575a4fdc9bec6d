package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/better-compute/bcd/components/base/nodespec"
	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
)

// External signing: a command or a spec change is prepared by the gateway
// (bcgw run --prepare, bcgw spec prepare), signed where the key lives
// (bcgw sign, no gateway needed) and submitted as it is (bcgw run
// --submit, bcgw spec submit). The prepared JSON is the signed frame's
// fields; a JSON body or spec stands for its compact encoding
// (json.Compact), so a file may be re-indented between the steps, but
// not otherwise changed.

// ---- commands ----

// ---- specs ----

func (s *API) adminPrepareCommand(w http.ResponseWriter, r *http.Request) {
	var req adminapi.CommandRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	if len(req.UserData) > 0 {
		adminErr(w, http.StatusBadRequest, errors.New("user data is not prepared: give it to bcgw run --submit"))
		return
	}
	p, err := s.PrepareCommand(req.Node, req.Kind, req.Body, time.Duration(req.DeadlineSeconds)*time.Second)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, p)
}

func (s *API) adminSubmitCommand(w http.ResponseWriter, r *http.Request) {
	var req adminapi.SubmitCommandRequest
	if err := decodeBody(r, &req); err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	secrets, err := commandSecrets(req.Command.Kind, req.UserData, req.SecretHeaders)
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	c, warning, err := s.SubmitCommand(req.Command, secrets)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	v := fleet.ViewCommand(c)
	v.Warning = warning
	writeJSON(w, v)
}

func (s *API) adminPrepareSpec(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, nodespec.MaxBytes+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	if len(b) > nodespec.MaxBytes {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body is over 4 MiB: a spec or a patch is at most %d bytes", nodespec.MaxBytes))
		return
	}
	patch := false
	switch q := r.URL.Query().Get("patch"); q {
	case "", "false", "0":
	case "true", "1":
		patch = true
	default:
		adminErr(w, http.StatusBadRequest, fmt.Errorf("patch=%q: true or false", adminapi.TruncateString(q, 16)))
		return
	}
	p, err := s.PrepareSpec(r.PathValue("id"), b, patch)
	if err != nil {
		adminErr(w, errCode(err, http.StatusBadRequest), err)
		return
	}
	writeJSON(w, p)
}

func (s *API) adminSubmitSpec(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, adminapi.MaxPrepared+1))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	var p adminapi.PreparedSpec
	if len(b) > adminapi.MaxPrepared {
		err = fmt.Errorf("request body is over %d bytes", adminapi.MaxPrepared)
	} else if err = adminapi.StrictDecode(b, &p); err != nil {
		err = fmt.Errorf("request body: %w", err)
	} else if p.Node != r.PathValue("id") {
		err = fmt.Errorf("the prepared spec is for %s, not %s", p.Node, r.PathValue("id"))
	}
	if err != nil {
		adminErr(w, http.StatusBadRequest, err)
		return
	}
	gen, warning, err := s.SubmitSpec(p)
	if err != nil {
		code := errCode(err, http.StatusBadRequest)
		if errors.Is(err, adminapi.ErrPreparedStale) {
			code = http.StatusConflict
		}
		adminErr(w, code, err)
		return
	}
	writeJSON(w, adminapi.SubmitView{Generation: gen, Warning: warning})
}
