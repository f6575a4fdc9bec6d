package admin

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/store"
)

// Every admin API call that may change state (any method but GET and
// HEAD, but for the two that only prepare a file to sign) is recorded
// after it answered: in the store's audit trail and in the log, with
// who made it (the admin token's name, "socket" for the admin socket).

// auditActions names the calls; a call not named here is recorded with
// its route as its action, so none goes unrecorded.
var auditActions = map[string]string{
	"POST /v1/tokens":                     "token.create",
	"DELETE /v1/tokens/{id}":              "token.rm",
	"POST /v1/admin-tokens":               "admin-token.create",
	"DELETE /v1/admin-tokens/{name}":      "admin-token.rm",
	"PUT /v1/releases/uploads/{sha256}":   "release.upload",
	"POST /v1/releases":                   "release.publish",
	"POST /v1/tpm/enroll":                 "tpm.enroll",
	"POST /v1/nodes/{id}/revoke":          "node.revoke",
	"DELETE /v1/nodes/{id}":               "node.rm",
	"POST /v1/commands":                   "command.send",
	"POST /v1/commands/submit":            "command.submit",
	"POST /v1/commands/{id}/cancel":       "command.cancel",
	"POST /v1/nodes/{id}/spec/submit":     "spec.submit",
	"PUT /v1/nodes/{id}/spec":             "spec.set",
	"PATCH /v1/nodes/{id}/spec":           "spec.patch",
	"POST /v1/nodes/{id}/holds":           "hold.add",
	"DELETE /v1/nodes/{id}/holds/{alloc}": "hold.release",
	"POST /v1/nodes/{id}/cache-images":    "site.cache-images",
	"POST /v1/trust/roots":                "trust.add-root",
	"POST /v1/trust/roots/remove":         "trust.remove-root",
	"POST /v1/trust/approvers":            "trust.approvers",
	"POST /v1/batches/submit":             "batch.submit",
	"POST /v1/bmc":                        "bmc.credentials",
	"POST /v1/ssh/ca":                     "ssh.ca",
	"POST /v1/ssh/sign":                   "ssh.sign",
	"POST /v1/nodes/{id}/tunnel":          "node.tunnel",
	"POST /v1/page/link":                  "page.link",
	"PUT /v1/secrets":                     "secret.set",
	"DELETE /v1/secrets":                  "secret.delete",
}

// notAudited are the calls that change nothing though not GETs.
var notAudited = map[string]bool{
	"POST /v1/commands/prepare":        true,
	"POST /v1/nodes/{id}/spec/prepare": true,
}

// audited reports whether a request's method may change state.
func audited(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead
}

// auditWriter notes the answer's status and the start of an error body.
type auditWriter struct {
	http.ResponseWriter
	code   int
	body   []byte
	target string // what a handler names as the call's target (auditTarget)
}

// auditTarget names what the call was on, when its path does not (a
// name in its body).
func auditTarget(w http.ResponseWriter, target string) {
	if aw, ok := w.(*auditWriter); ok {
		aw.target = target
	}
}

func (w *auditWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	if w.code >= 400 && len(w.body) < 2048 {
		w.body = append(w.body, b[:min(len(b), 2048-len(w.body))]...)
	}
	return w.ResponseWriter.Write(b)
}

// Hijack lets a tunnel take the connection (recorded as 101).
func (w *auditWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be taken over")
	}
	w.code = http.StatusSwitchingProtocols
	return hj.Hijack()
}

func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// record stores and logs the audit entry of an answered call.
func (s *API) record(r *http.Request, w *auditWriter) {
	if notAudited[r.Pattern] {
		return
	}
	action := cmp.Or(auditActions[r.Pattern], r.Pattern, r.Method+" "+r.URL.Path)
	e := store.AuditEntry{At: s.Now().UTC(), Actor: actorOf(r), Gateway: s.Name(), Action: action,
		Target: cmp.Or(w.target, r.PathValue("id"), r.PathValue("name")), Status: cmp.Or(w.code, http.StatusOK)}
	if a := r.PathValue("alloc"); a != "" {
		e.Target += "/" + a
	}
	e.Target = short(e.Target)
	if e.Status >= 400 {
		var body struct{ Error string }
		if json.Unmarshal(w.body, &body) == nil {
			e.Error = body.Error
		}
	}
	if _, err := s.store.AddAudit(e); err != nil {
		s.log.Error("admin call not recorded in the audit trail", "actor", e.Actor, "action", e.Action, "target", e.Target, "err", err)
	}
	s.log.Info("admin call", "actor", e.Actor, "action", e.Action, "target", e.Target, "status", e.Status, "error", e.Error)
}

func (s *API) adminAudit(w http.ResponseWriter, r *http.Request) {
	var after uint64
	limit := 0
	q := r.URL.Query()
	if a := q.Get("after"); a != "" {
		var err error
		if after, err = strconv.ParseUint(a, 10, 64); err != nil {
			adminErr(w, http.StatusBadRequest, errors.New("after must be an audit seq (a whole number)"))
			return
		}
	}
	if l := q.Get("limit"); l != "" {
		var err error
		if limit, err = strconv.Atoi(l); err != nil || limit < 0 {
			adminErr(w, http.StatusBadRequest, errors.New("limit must be a whole number"))
			return
		}
	}
	es, err := s.store.Audit(after, limit)
	if err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	out := make([]adminapi.AuditView, 0, len(es))
	for _, e := range es {
		out = append(out, adminapi.AuditView(e))
	}
	writeJSON(w, out)
}
