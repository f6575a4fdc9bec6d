package admin

import (
	"bytes"
	_ "embed"
	"errors"
	"html/template"
	"net/http"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/gateway/adminapi"
	"github.com/better-compute/bcd/components/gateway/fleet"
)

// The fleet page is read-only HTML on the admin listeners: on the socket
// as the API, and on the loopback listener with the admin token, or with
// the session cookie a one-time link set (a browser cannot send the
// bearer header). The cookie lets in GET /fleet only, never the API.

//go:embed fleet.html
var fleetHTML string

var fleetTemplate = template.Must(template.New("fleet").Parse(fleetHTML))

const (
	pageCookie     = "bcgw_page"
	pageLinkTTL    = time.Minute
	pageSessionTTL = 8 * time.Hour
)

// pageAuth holds the page's one-time link codes and browser sessions, by
// the admin token name that made them; in memory, so a restart ends them.
type pageAuth struct {
	mu       sync.Mutex
	codes    map[string]pageGrant
	sessions map[string]pageGrant
}

type pageGrant struct {
	actor   string
	expires time.Time
}

func (a *pageAuth) prune(now time.Time) {
	for _, m := range []map[string]pageGrant{a.codes, a.sessions} {
		for k, g := range m {
			if !now.Before(g.expires) {
				delete(m, k)
			}
		}
	}
}

// mint makes a one-time code for actor.
func (a *pageAuth) mint(actor string, now time.Time) (string, time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.codes == nil {
		a.codes, a.sessions = map[string]pageGrant{}, map[string]pageGrant{}
	}
	a.prune(now)
	code := fleet.RandomID(24)
	a.codes[code] = pageGrant{actor: actor, expires: now.Add(pageLinkTTL)}
	return code, now.Add(pageLinkTTL)
}

// spend takes a code once and makes a session for its actor.
func (a *pageAuth) spend(code string, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.codes[code]
	if !ok || code == "" {
		return "", false
	}
	delete(a.codes, code)
	if !now.Before(g.expires) {
		return "", false
	}
	sid := fleet.RandomID(32)
	a.sessions[sid] = pageGrant{actor: g.actor, expires: now.Add(pageSessionTTL)}
	return sid, true
}

// session returns the actor of a live session.
func (a *pageAuth) session(sid string, now time.Time) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.sessions[sid]
	if !ok || sid == "" || !now.Before(g.expires) {
		return "", false
	}
	return g.actor, true
}

// pageSession is the actor of the request's page cookie, if it is live.
func (s *API) pageSession(r *http.Request) (string, bool) {
	c, err := r.Cookie(pageCookie)
	if err != nil {
		return "", false
	}
	return s.page.session(c.Value, s.Now())
}

func (s *API) adminPageLink(w http.ResponseWriter, r *http.Request) {
	base := s.AdminURL()
	if base == "" {
		adminErr(w, http.StatusConflict, errors.New("the fleet page is on the loopback admin listener: run bcgw serve with --admin-listen"))
		return
	}
	code, exp := s.page.mint(actorOf(r), s.Now())
	writeJSON(w, adminapi.PageLink{URL: base + "/fleet/login?code=" + code, ExpiresAt: exp.UTC()})
}

func (s *API) pageLogin(w http.ResponseWriter, r *http.Request) {
	sid, ok := s.page.spend(r.URL.Query().Get("code"), s.Now())
	if !ok {
		pageRefused(w, "this link was used already, has expired, or was never made")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: pageCookie, Value: sid, Path: "/fleet", MaxAge: int(pageSessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode})
	s.log.Info("fleet page session started", "actor", s.page.actorOfSession(sid))
	http.Redirect(w, r, "/fleet", http.StatusSeeOther)
}

func (a *pageAuth) actorOfSession(sid string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sessions[sid].actor
}

func pageHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// pageRefused answers 401 with a page that says how to get in.
func pageRefused(w http.ResponseWriter, why string) {
	pageHeaders(w)
	w.WriteHeader(http.StatusUnauthorized)
	_ = refusedTemplate.Execute(w, why)
}

var refusedTemplate = template.Must(template.New("refused").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bcgw fleet: refused</title></head>
<body><h1>The fleet page needs the admin token</h1><p>{{.}}.</p>
<p>Run <code>bcgw page</code> on the gateway host for a one-time link, or send <code>Authorization: Bearer</code> with an admin token.</p></body></html>
`))

func (s *API) fleetPage(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	if err := fleetTemplate.Execute(&buf, s.buildPage()); err != nil {
		adminErr(w, http.StatusInternalServerError, err)
		return
	}
	pageHeaders(w)
	_, _ = w.Write(buf.Bytes())
}
