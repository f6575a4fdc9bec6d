// Package redfishtest is a Redfish BMC for tests: an httptest TLS server
// with a fresh self-signed certificate that serves the DMTF
// public-rackmount1 mockup (testdata/) and models the state the site
// agent's operations change: power (Reset actions, with an optional
// PoweringOff phase), the boot source override, every virtual media slot
// and Supermicro's OEM IsoConfig, sessions, the account password and
// pending BIOS settings (wherever @Redfish.Settings names them). Options
// replace or remove mockup resources, fail chosen requests and serve
// legacy TLS. Tests observe that state through the Server's
// methods, and can make the server misbehave the way a hostile or broken
// BMC would.
package redfishtest

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/components/trust/pki"
)

//go:embed testdata/public-rackmount1
var mockup embed.FS

// Paths of the mockup's resources the server models.
const (
	Root        = "/redfish/v1"
	SystemID    = "437XR1138R2"
	System      = Root + "/Systems/" + SystemID
	Manager     = Root + "/Managers/BMC"
	Account     = Root + "/AccountService/Accounts/1"
	Sessions    = Root + "/SessionService/Sessions"
	Bios        = System + "/Bios"
	BiosPending = Bios + "/Settings"
	systemMedia = System + "/VirtualMedia"
	mgrMedia    = Manager + "/VirtualMedia"
)

// Misbehavior makes the server act as a hostile or broken BMC.
type Misbehavior int

// Misbehaviors.
const (
	Behave Misbehavior = iota
	// LinkOutsideRoot: the Systems collection and the system's
	// EthernetInterfaces link name paths outside /redfish/v1.
	LinkOutsideRoot
	// LinkOtherHost: the Systems collection names the system on another
	// host (an absolute https URL).
	LinkOtherHost
	// RedirectOtherHost: GETs of the Systems collection and of the system
	// are redirected (307) to Options.RedirectTo.
	RedirectOtherHost
	// EchoCredentials: error messages repeat the password the request
	// carried (as some BMCs do in their validation messages), and every
	// password change is refused that way.
	EchoCredentials
	// HugeBody: the system resource is padded beyond 4 MiB.
	HugeBody
)

// Options configure a Server. The zero value serves the mockup to
// "Administrator" with DefaultPassword.
type Options struct {
	Username string // default "Administrator" (the mockup's account 1)
	Password string // default DefaultPassword
	// NoSessions: the session service answers 405, so clients must use
	// basic authentication.
	NoSessions bool
	// RequireIfMatch: a PATCH without If-Match answers 428.
	RequireIfMatch bool
	// ResetTypes replaces the ResetType allowable values the system
	// advertises (the mockup lists no PowerCycle).
	ResetTypes []string
	// VirtualMediaOnManager serves the virtual media under Managers/BMC,
	// where BMCs before Redfish 2021.1 have it, instead of under the system.
	VirtualMediaOnManager bool
	// HideMediaActions drops the InsertMedia/EjectMedia actions from the
	// CD resource (the mockup has none; the server adds them by default);
	// the standard action paths still answer.
	HideMediaActions bool
	// Extra serves more resources (path under /redfish/v1 → JSON), e.g. a
	// Storage tree; the system links "Storage" when Extra has System+"/Storage".
	// An Extra resource replaces the mockup's at the same path; an empty
	// value removes the mockup's resource (it answers 404).
	Extra map[string]string
	// Fail answers "METHOD /redfish/v1/..." with the status given (and a
	// Redfish error body) instead of serving it: a slot whose InsertMedia
	// answers 405, a drive whose GET answers 500.
	Fail map[string]int
	// OffDelay keeps a system that was forced off in PoweringOff for this
	// many reads of the system before it reads Off; an On sent meanwhile
	// answers 409, as BMCs refuse to power on a system still going down.
	OffDelay int
	// LegacyTLS serves TLS 1.2 only, with an RSA certificate and only the
	// RSA key-exchange cipher suites, as old BMCs do.
	LegacyTLS bool
	// Misbehave selects a misbehavior; SetMisbehave changes it later.
	Misbehave Misbehavior
	// RedirectTo is where RedirectOtherHost sends clients (default
	// https://other.example).
	RedirectTo string
}

// DefaultPassword is the account's password when Options.Password is empty.
const DefaultPassword = "redfish-test-password"

// Request is one request the server received.
type Request struct {
	Method string
	Path   string
	Auth   string // "", "basic", "token", or "bad" (credentials refused)
}

// Server is a running test BMC.
type Server struct {
	srv  *httptest.Server
	opts Options
	pin  string

	resources map[string][]byte // path → mockup JSON

	mu        sync.Mutex
	misbehave Misbehavior
	requests  []Request
	sessions  map[string]string // token → session id
	sessionN  int
	password  string
	power     string
	resets    []string
	cycles    int
	bootTgt   string
	bootEn    string
	media     map[string]*mediaState // VirtualMedia resource → its state
	smc       *smcState              // the Supermicro OEM IsoConfig, when served
	offReads  int                    // reads left before PoweringOff becomes Off
	biosSet   string                 // the BIOS settings object, "" when none
	biosCur   map[string]any
	biosPend  map[string]any
	versions  map[string]int // resource → PATCH count, for ETags
}

// New starts a server. Close it when done.
func New(opts Options) (*Server, error) {
	if opts.Username == "" {
		opts.Username = "Administrator"
	}
	if opts.Password == "" {
		opts.Password = DefaultPassword
	}
	if opts.RedirectTo == "" {
		opts.RedirectTo = "https://other.example"
	}
	s := &Server{opts: opts, misbehave: opts.Misbehave, sessions: map[string]string{}, password: opts.Password,
		resources: map[string][]byte{}, versions: map[string]int{}}
	if err := s.load(); err != nil {
		return nil, err
	}
	cert, pin, err := selfSigned(opts.LegacyTLS)
	if err != nil {
		return nil, err
	}
	s.pin = pin
	s.srv = httptest.NewUnstartedServer(s)
	s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if opts.LegacyTLS {
		s.srv.TLS.MaxVersion = tls.VersionTLS12
		s.srv.TLS.CipherSuites = LegacyCipherSuites
	}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the pin check aborts
	s.srv.StartTLS()
	return s, nil
}

// Start is New for a test: it fails the test on error and closes the
// server at the test's end.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatalf("redfishtest: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// Addr is the server's host:port.
func (s *Server) Addr() string { return s.srv.Listener.Addr().String() }

// URL is https://host:port.
func (s *Server) URL() string { return s.srv.URL }

// Pin is the SPKI pin of the server's certificate.
func (s *Server) Pin() string { return s.pin }

// Username is the account's user name.
func (s *Server) Username() string { return s.opts.Username }

// LegacyCipherSuites are the only suites a LegacyTLS server offers: RSA
// key exchange, no forward secrecy, what old BMCs speak.
var LegacyCipherSuites = []uint16{
	tls.TLS_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_RSA_WITH_AES_128_CBC_SHA, tls.TLS_RSA_WITH_AES_256_CBC_SHA,
}

// rsaKey is generated once per test binary: RSA key generation is slow.
var rsaKey = sync.OnceValues(func() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) })

func selfSigned(legacy bool) (tls.Certificate, string, error) {
	var key crypto.Signer
	var err error
	if legacy {
		key, err = rsaKey()
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		return tls.Certificate{}, "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "redfishtest BMC"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// A BMC's certificate rarely names the address it is reached at.
		DNSNames: []string{"bmc.invalid"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	pin, err := pki.Pin(key.Public())
	if err != nil {
		return tls.Certificate{}, "", err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pin, nil
}

// load reads the mockup tree and the state it starts from.
func (s *Server) load() error {
	const dir = "testdata/public-rackmount1"
	err := fs.WalkDir(mockup, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Base(p) != "index.json" {
			return err
		}
		b, err := mockup.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(path.Dir(p), dir)
		res := Root + rel
		if s.opts.VirtualMediaOnManager {
			b = bytes.ReplaceAll(b, []byte(systemMedia), []byte(mgrMedia))
			res = strings.Replace(res, systemMedia, mgrMedia, 1)
		}
		s.resources[res] = b
		return nil
	})
	if err != nil {
		return fmt.Errorf("redfishtest: load mockup: %w", err)
	}
	for p, b := range s.opts.Extra {
		if b == "" {
			delete(s.resources, strings.TrimSuffix(p, "/"))
			continue
		}
		s.resources[strings.TrimSuffix(p, "/")] = []byte(b)
	}
	sys, err := s.resource(System)
	if err != nil {
		return err
	}
	s.power, _ = sys["PowerState"].(string)
	boot, _ := sys["Boot"].(map[string]any)
	s.bootTgt, _ = boot["BootSourceOverrideTarget"].(string)
	s.bootEn, _ = boot["BootSourceOverrideEnabled"].(string)
	s.media = map[string]*mediaState{}
	for p := range s.resources {
		m, err := s.resource(p)
		if err != nil {
			return err
		}
		typ, _ := m["@odata.type"].(string)
		switch {
		case strings.HasPrefix(typ, "#VirtualMedia.") && !strings.HasSuffix(typ, "Collection"):
			st := &mediaState{}
			st.image, _ = m["Image"].(string)
			st.inserted, _ = m["Inserted"].(bool)
			s.media[p] = st
		case strings.HasPrefix(typ, "#IsoConfig."):
			s.smc = &smcState{path: p}
			s.smc.host, _ = m["Host"].(string)
			s.smc.file, _ = m["Path"].(string)
		}
	}
	bios, err := s.resource(Bios)
	if err != nil {
		return err
	}
	s.biosCur, _ = bios["Attributes"].(map[string]any)
	s.biosPend = map[string]any{}
	if set, ok := bios["@Redfish.Settings"].(map[string]any); ok {
		obj, _ := set["SettingsObject"].(map[string]any)
		s.biosSet, _ = obj["@odata.id"].(string)
		s.biosSet = strings.TrimSuffix(s.biosSet, "/")
	}
	if s.biosSet != "" {
		pend, err := s.resource(s.biosSet)
		if err != nil {
			return err
		}
		s.biosPend, _ = pend["Attributes"].(map[string]any)
		if s.biosPend == nil {
			s.biosPend = map[string]any{}
		}
	}
	return nil
}

// mediaState is one virtual media slot's image.
type mediaState struct {
	image    string
	inserted bool
}

// smcState is the Supermicro OEM virtual media (IsoConfig): the share's
// host and path, and whether it is mounted.
type smcState struct {
	path       string
	host, file string
	mounted    bool
}

func (s *Server) mediaColl() string {
	if s.opts.VirtualMediaOnManager {
		return mgrMedia
	}
	return systemMedia
}

// resource decodes a stored resource afresh.
func (s *Server) resource(p string) (map[string]any, error) {
	b, ok := s.resources[p]
	if !ok {
		return nil, fmt.Errorf("redfishtest: no resource %s", p)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("redfishtest: %s: %w", p, err)
	}
	return m, nil
}

// SetMisbehave changes the misbehavior.
func (s *Server) SetMisbehave(m Misbehavior) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.misbehave = m
}

// SetPowerState sets the system's PowerState.
func (s *Server) SetPowerState(state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.power = state
}

// PowerState is the system's PowerState.
func (s *Server) PowerState() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.power
}

// Resets lists the ResetTypes the server accepted, in order.
func (s *Server) Resets() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resets)
}

// Cycles counts the restarts (PowerCycle, ForceRestart, GracefulRestart).
func (s *Server) Cycles() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cycles
}

// Boot is the boot source override target and its enabled state.
func (s *Server) Boot() (target, enabled string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootTgt, s.bootEn
}

// Media is the CD's image and whether it is inserted.
func (s *Server) Media() (image string, inserted bool) {
	return s.MediaAt(s.mediaColl() + "/CD1")
}

// MediaAt is the image of the virtual media slot at path and whether it is
// inserted.
func (s *Server) MediaAt(path string) (image string, inserted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.media[path]; st != nil {
		return st.image, st.inserted
	}
	return "", false
}

// OEMMedia is the Supermicro OEM virtual media: Host, Path and whether it
// is mounted.
func (s *Server) OEMMedia() (host, file string, mounted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.smc == nil {
		return "", "", false
	}
	return s.smc.host, s.smc.file, s.smc.mounted
}

// Password is the account's current password.
func (s *Server) Password() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.password
}

// BIOS returns copies of the current and the pending BIOS attributes.
func (s *Server) BIOS() (current, pending map[string]any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp := func(m map[string]any) map[string]any {
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return cp(s.biosCur), cp(s.biosPend)
}

// Requests lists the requests received, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// LiveSessions counts the sessions opened and not deleted.
func (s *Server) LiveSessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := strings.TrimSuffix(r.URL.Path, "/")
	if p == "" {
		p = "/"
	}
	auth := s.authenticate(r)
	s.requests = append(s.requests, Request{Method: r.Method, Path: p, Auth: auth})
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		s.fail(w, http.StatusBadRequest, "MalformedJSON", "The request body could not be read.")
		return
	}
	if s.misbehave == RedirectOtherHost && r.Method == http.MethodGet && (p == Root+"/Systems" || p == System) {
		http.Redirect(w, r, strings.TrimSuffix(s.opts.RedirectTo, "/")+p, http.StatusTemporaryRedirect)
		return
	}
	public := r.Method == http.MethodGet && (p == Root || p == "/redfish")
	if r.Method == http.MethodPost && p == Sessions {
		s.login(w, body)
		return
	}
	if !public && auth != "basic" && auth != "token" {
		msg := "The credentials are missing or refused."
		if s.misbehave == EchoCredentials {
			if _, pw, ok := r.BasicAuth(); ok {
				msg = fmt.Sprintf("Login failed: %q is not the password of this account.", pw)
			}
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="redfishtest"`)
		s.fail(w, http.StatusUnauthorized, "NoValidSession", msg)
		return
	}
	if code, ok := s.opts.Fail[r.Method+" "+p]; ok {
		s.fail(w, code, "GeneralError", fmt.Sprintf("The request failed (status %d set by the test).", code))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.get(w, p)
	case http.MethodPost:
		s.action(w, p, body)
	case http.MethodPatch:
		s.patch(w, r, p, body)
	case http.MethodDelete:
		s.logout(w, p)
	default:
		s.fail(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "The method is not allowed here.")
	}
}

func (s *Server) authenticate(r *http.Request) string {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		if _, ok := s.sessions[tok]; ok {
			return "token"
		}
		return "bad"
	}
	if u, pw, ok := r.BasicAuth(); ok {
		if s.credentialsOK(u, pw) {
			return "basic"
		}
		return "bad"
	}
	return ""
}

func (s *Server) credentialsOK(user, pw string) bool {
	return subtle.ConstantTimeCompare([]byte(user), []byte(s.opts.Username)) == 1 &&
		subtle.ConstantTimeCompare([]byte(pw), []byte(s.password)) == 1
}

func (s *Server) login(w http.ResponseWriter, body []byte) {
	if s.opts.NoSessions {
		s.fail(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "Sessions are not supported.")
		return
	}
	var in struct {
		UserName string
		Password string
	}
	if err := json.Unmarshal(body, &in); err != nil {
		s.fail(w, http.StatusBadRequest, "MalformedJSON", "The request body is not JSON.")
		return
	}
	if !s.credentialsOK(in.UserName, in.Password) {
		s.requests[len(s.requests)-1].Auth = "bad"
		msg := "The credentials are refused."
		if s.misbehave == EchoCredentials {
			msg = fmt.Sprintf("Login failed for %s with password %s.", in.UserName, in.Password)
		}
		s.fail(w, http.StatusUnauthorized, "NoValidSession", msg)
		return
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	s.sessionN++
	id := fmt.Sprintf("S%04d", s.sessionN)
	s.sessions[hex.EncodeToString(tok[:])] = id
	w.Header().Set("X-Auth-Token", hex.EncodeToString(tok[:]))
	w.Header().Set("Location", Sessions+"/"+id)
	s.write(w, http.StatusCreated, s.session(id))
}

func (s *Server) session(id string) map[string]any {
	return map[string]any{"@odata.id": Sessions + "/" + id, "@odata.type": "#Session.v1_6_0.Session",
		"Id": id, "Name": "User Session", "UserName": s.opts.Username}
}

func (s *Server) logout(w http.ResponseWriter, p string) {
	for tok, id := range s.sessions {
		if p == Sessions+"/"+id {
			delete(s.sessions, tok)
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	s.fail(w, http.StatusNotFound, "ResourceMissingAtURI", "No such session.")
}

// render returns a resource with the modelled state laid over the mockup.
func (s *Server) render(p string) (map[string]any, bool) {
	if p == Sessions {
		var members []any
		for _, id := range s.sessions {
			members = append(members, map[string]any{"@odata.id": Sessions + "/" + id})
		}
		slices.SortFunc(members, func(a, b any) int {
			return strings.Compare(a.(map[string]any)["@odata.id"].(string), b.(map[string]any)["@odata.id"].(string))
		})
		return map[string]any{"@odata.id": Sessions, "@odata.type": "#SessionCollection.SessionCollection",
			"Name": "Session Collection", "Members": members, "Members@odata.count": len(members)}, true
	}
	for _, id := range s.sessions {
		if p == Sessions+"/"+id {
			return s.session(id), true
		}
	}
	m, err := s.resource(p)
	if err != nil {
		return nil, false
	}
	switch p {
	case Root + "/Systems":
		switch s.misbehave {
		case LinkOutsideRoot:
			m["Members"] = []any{map[string]any{"@odata.id": "/redfish/v1/../../outside/Systems/" + SystemID}}
		case LinkOtherHost:
			m["Members"] = []any{map[string]any{"@odata.id": "https://other.example" + System}}
		}
	case System:
		if s.power == "PoweringOff" {
			if s.offReads--; s.offReads <= 0 {
				s.power = "Off"
			}
		}
		m["PowerState"] = s.power
		boot := m["Boot"].(map[string]any)
		boot["BootSourceOverrideTarget"] = s.bootTgt
		boot["BootSourceOverrideEnabled"] = s.bootEn
		if s.opts.ResetTypes != nil {
			reset := m["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any)
			reset["ResetType@Redfish.AllowableValues"] = s.opts.ResetTypes
		}
		if s.opts.VirtualMediaOnManager {
			delete(m, "VirtualMedia")
		}
		if _, ok := s.resources[System+"/Storage"]; ok {
			m["Storage"] = map[string]any{"@odata.id": System + "/Storage"}
		}
		switch s.misbehave {
		case LinkOutsideRoot:
			m["EthernetInterfaces"] = map[string]any{"@odata.id": "/redfish/v1/Systems/../../../etc/EthernetInterfaces"}
		case HugeBody:
			m["Oem"] = map[string]any{"Padding": strings.Repeat("x", 5<<20)}
		}
	case Manager:
		if s.opts.VirtualMediaOnManager {
			m["VirtualMedia"] = map[string]any{"@odata.id": mgrMedia}
		}
	case s.mediaColl() + "/CD1":
		if _, extra := s.opts.Extra[p]; !s.opts.HideMediaActions && !extra {
			m["Actions"] = map[string]any{
				"#VirtualMedia.InsertMedia": map[string]any{"target": p + "/Actions/VirtualMedia.InsertMedia"},
				"#VirtualMedia.EjectMedia":  map[string]any{"target": p + "/Actions/VirtualMedia.EjectMedia"},
			}
		}
	case Account:
		m["UserName"] = s.opts.Username
	case Bios:
		m["Attributes"] = s.biosCur
		if set, ok := m["@Redfish.Settings"].(map[string]any); ok {
			set["SupportedApplyTimes"] = []string{"OnReset"}
		}
	case Root + "/SessionService":
		if s.opts.NoSessions {
			m["ServiceEnabled"] = false
		}
	}
	if st := s.media[p]; st != nil {
		m["Image"] = st.image
		m["Inserted"] = st.inserted
	}
	if s.smc != nil && p == s.smc.path {
		m["Host"], m["Path"] = s.smc.host, s.smc.file
	}
	if s.biosSet != "" && p == s.biosSet {
		merged := map[string]any{}
		for k, v := range s.biosCur {
			merged[k] = v
		}
		for k, v := range s.biosPend {
			merged[k] = v
		}
		m["Attributes"] = merged
	}
	return m, true
}

func (s *Server) etag(p string, m map[string]any) string {
	b, _ := json.Marshal(m)
	sum := sha256.Sum256(fmt.Appendf(b, "%d", s.versions[p]))
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

func (s *Server) get(w http.ResponseWriter, p string) {
	m, ok := s.render(p)
	if !ok {
		s.fail(w, http.StatusNotFound, "ResourceMissingAtURI", "The resource is not in this mockup.")
		return
	}
	if p == System || p == Account || (s.biosSet != "" && p == s.biosSet) || s.media[p] != nil || (s.smc != nil && p == s.smc.path) {
		w.Header().Set("ETag", s.etag(p, m))
	}
	s.write(w, http.StatusOK, m)
}

var resetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton", "PowerCycle"}

func (s *Server) action(w http.ResponseWriter, p string, body []byte) {
	var in map[string]any
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &in); err != nil {
			s.fail(w, http.StatusBadRequest, "MalformedJSON", "The request body is not JSON.")
			return
		}
	}
	switch p {
	case System + "/Actions/ComputerSystem.Reset":
		rt, _ := in["ResetType"].(string)
		allowed := resetTypes[:8]
		if s.opts.ResetTypes != nil {
			allowed = s.opts.ResetTypes
		}
		if !slices.Contains(allowed, rt) {
			s.fail(w, http.StatusBadRequest, "ActionParameterNotSupported", fmt.Sprintf("ResetType %q is not supported.", rt))
			return
		}
		if (rt == "On" || rt == "ForceOn") && s.power == "PoweringOff" {
			s.fail(w, http.StatusConflict, "ResourceInUse", "The system is still powering off.")
			return
		}
		s.reset(rt)
		w.WriteHeader(http.StatusNoContent)
	default:
		if slot, ok := strings.CutSuffix(p, "/Actions/VirtualMedia.InsertMedia"); ok && s.media[slot] != nil {
			st := s.media[slot]
			img, _ := in["Image"].(string)
			if img == "" {
				s.fail(w, http.StatusBadRequest, "ActionParameterMissing", "Image is required.")
				return
			}
			if st.inserted {
				s.fail(w, http.StatusConflict, "ResourceInUse", "Media is already inserted; eject it first.")
				return
			}
			st.image, st.inserted = img, true
			s.versions[slot]++
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if slot, ok := strings.CutSuffix(p, "/Actions/VirtualMedia.EjectMedia"); ok && s.media[slot] != nil {
			s.media[slot].image, s.media[slot].inserted = "", false
			s.versions[slot]++
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if s.smc != nil && p == s.smc.path+"/Actions/IsoConfig.Mount" {
			if s.smc.host == "" || s.smc.file == "" {
				s.fail(w, http.StatusBadRequest, "ActionParameterMissing", "Configure Host and Path first.")
				return
			}
			s.smc.mounted = true
			w.WriteHeader(http.StatusOK)
			return
		}
		if s.smc != nil && p == s.smc.path+"/Actions/IsoConfig.UnMount" {
			s.smc.mounted = false
			w.WriteHeader(http.StatusOK)
			return
		}
		s.fail(w, http.StatusNotFound, "ActionNotSupported", "No such action.")
	}
}

// reset applies a ResetType to the power state; restarts and power-ons
// apply the pending BIOS settings.
func (s *Server) reset(rt string) {
	s.resets = append(s.resets, rt)
	wasOn, boots := s.power == "On", false
	switch rt {
	case "On", "ForceOn":
		s.power, boots = "On", !wasOn
	case "ForceOff", "GracefulShutdown":
		s.power = "Off"
		if s.opts.OffDelay > 0 {
			s.power, s.offReads = "PoweringOff", s.opts.OffDelay
		}
	case "PushPowerButton":
		if wasOn {
			s.power = "Off"
		} else {
			s.power, boots = "On", true
		}
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		s.power, boots = "On", true
		s.cycles++
	}
	if boots {
		for k, v := range s.biosPend {
			s.biosCur[k] = v
		}
		s.biosPend = map[string]any{}
	}
}

func (s *Server) patch(w http.ResponseWriter, r *http.Request, p string, body []byte) {
	m, ok := s.render(p)
	if !ok {
		s.fail(w, http.StatusNotFound, "ResourceMissingAtURI", "The resource is not in this mockup.")
		return
	}
	match := r.Header.Get("If-Match")
	if match == "" && s.opts.RequireIfMatch {
		s.fail(w, http.StatusPreconditionRequired, "PreconditionRequired", "If-Match is required.")
		return
	}
	if match != "" && match != "*" && match != s.etag(p, m) {
		s.fail(w, http.StatusPreconditionFailed, "PreconditionFailed", "The ETag does not match.")
		return
	}
	var in map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&in); err != nil {
		s.fail(w, http.StatusBadRequest, "MalformedJSON", "The request body is not JSON.")
		return
	}
	switch p {
	case System:
		s.patchBoot(w, in)
	case Account:
		pw, ok := in["Password"].(string)
		if !ok || len(in) != 1 {
			s.fail(w, http.StatusBadRequest, "PropertyNotWritable", "Only Password can be changed here.")
			return
		}
		if len(pw) < 8 {
			s.fail(w, http.StatusBadRequest, "PropertyValueFormatError", "The password does not meet the length requirement.")
			return
		}
		if s.misbehave == EchoCredentials {
			s.fail(w, http.StatusBadRequest, "PropertyValueFormatError",
				fmt.Sprintf("The password %s does not meet the complexity requirements.", pw))
			return
		}
		s.password = pw
		s.versions[p]++
		w.WriteHeader(http.StatusNoContent)
	case s.biosSet:
		if p == "" {
			s.fail(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "The resource cannot be patched.")
			return
		}
		attrs, ok := in["Attributes"].(map[string]any)
		for k := range in {
			if k != "Attributes" && k != "@Redfish.SettingsApplyTime" {
				ok = false
			}
		}
		if !ok {
			s.fail(w, http.StatusBadRequest, "PropertyUnknown", "Only Attributes can be changed here.")
			return
		}
		for k := range attrs {
			if _, known := s.biosCur[k]; !known {
				s.fail(w, http.StatusBadRequest, "PropertyUnknown", fmt.Sprintf("The attribute %s is unknown.", k))
				return
			}
		}
		for k, v := range attrs {
			s.biosPend[k] = v
		}
		s.versions[p]++
		w.WriteHeader(http.StatusNoContent)
	default:
		if s.media[p] != nil {
			s.fail(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "Use the InsertMedia and EjectMedia actions.")
			return
		}
		if s.smc != nil && p == s.smc.path {
			host, _ := in["Host"].(string)
			file, _ := in["Path"].(string)
			if host == "" || file == "" {
				s.fail(w, http.StatusBadRequest, "PropertyMissing", "Host and Path are required.")
				return
			}
			s.smc.host, s.smc.file = host, file
			s.versions[p]++
			w.WriteHeader(http.StatusNoContent)
			return
		}
		s.fail(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "The resource cannot be patched.")
	}
}

func (s *Server) patchBoot(w http.ResponseWriter, in map[string]any) {
	boot, ok := in["Boot"].(map[string]any)
	if !ok || len(in) != 1 {
		s.fail(w, http.StatusBadRequest, "PropertyNotWritable", "Only Boot can be changed here.")
		return
	}
	tgt, en := s.bootTgt, s.bootEn
	for k, v := range boot {
		str, _ := v.(string)
		switch k {
		case "BootSourceOverrideTarget":
			if !slices.Contains([]string{"None", "Pxe", "Cd", "Usb", "Hdd", "BiosSetup", "Utilities", "Diags", "SDCard", "UefiTarget"}, str) {
				s.fail(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("%q is not a boot source.", str))
				return
			}
			tgt = str
		case "BootSourceOverrideEnabled":
			if !slices.Contains([]string{"Disabled", "Once", "Continuous"}, str) {
				s.fail(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("%q is not an override mode.", str))
				return
			}
			en = str
		default:
			s.fail(w, http.StatusBadRequest, "PropertyNotWritable", fmt.Sprintf("Boot/%s cannot be changed here.", k))
			return
		}
	}
	s.bootTgt, s.bootEn = tgt, en
	s.versions[System]++
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) write(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// fail writes a Redfish error with one extended message.
func (s *Server) fail(w http.ResponseWriter, status int, id, msg string) {
	s.write(w, status, map[string]any{"error": map[string]any{
		"code":    "Base.1.15.0.GeneralError",
		"message": "A general error has occurred. See ExtendedInfo for more information.",
		"@Message.ExtendedInfo": []any{map[string]any{
			"@odata.type": "#Message.v1_1_1.Message", "MessageId": "Base.1.15.0." + id,
			"Message": msg, "Severity": "Warning",
		}},
	}})
}

// HostPort splits Addr for tests that need the IP.
func (s *Server) HostPort() (net.IP, string) {
	h, p, _ := net.SplitHostPort(s.Addr())
	return net.ParseIP(h), p
}
