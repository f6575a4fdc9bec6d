// Package bootserver is a site agent's boot server: the boot entries the
// gateway prepared (boot-entries.json), the HTTP side (iPXE scripts per
// MAC at /boot/ipxe, verified images at /cache/t/<grant>/images/<digest>),
// and, when configured, proxy DHCP and read-only TFTP. It answers a
// machine only while the site holds the boot lease, and serves the image
// cache only under a grant: each prepared machine gets its own (in its
// script's URLs and its bc.cache), so a machine nobody prepared, or one
// whose entry is gone, reads nothing from the cache.
package bootserver

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/components/base/atomicfile"
	"github.com/better-compute/bcd/components/base/config"
	"github.com/better-compute/bcd/components/boot/imagecache"
	"github.com/better-compute/bcd/components/boot/ipxe"
	"github.com/better-compute/bcd/components/boot/proxydhcp"
	"github.com/better-compute/bcd/components/boot/tftpd"
)

// EntriesFile is the boot entries' file under the data directory.
const EntriesFile = "boot-entries.json"

// Entry is one prepared machine.
type Entry struct {
	MAC    string `json:"mac"`
	Kernel string `json:"kernel_sha256,omitempty"`
	Initrd string `json:"initrd_sha256,omitempty"`
	// ISO, when set, is an ISO the machine boots with sanboot instead of
	// a kernel and initrd (boot.prepareISO).
	ISO     string    `json:"iso_sha256,omitempty"`
	Cmdline string    `json:"cmdline"` // console arguments and the rendered bc.* parameters
	Command string    `json:"command_id"`
	Created time.Time `json:"created"`
	// Grant names the machine in its cache URLs (/cache/t/<grant>/):
	// 128 random bits, hex.
	Grant string `json:"grant"`
}

// NewGrant makes a cache grant.
func NewGrant() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // it never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// CachePath is the cache URL path of a grant: bc.cache is the boot URL
// with it, and images are at CachePath(grant)/images/<digest>.
func CachePath(grant string) string { return "/cache/t/" + grant }

// Entries are the boot entries, kept in memory and in data_dir.
type Entries struct {
	mu   sync.Mutex
	path string
	by   map[string]Entry // by lower-case MAC
}

// OpenEntries loads data_dir/boot-entries.json (none is fine).
func OpenEntries(dataDir string) (*Entries, error) {
	e := &Entries{path: filepath.Join(dataDir, EntriesFile), by: map[string]Entry{}}
	b, err := os.ReadFile(e.path)
	if errors.Is(err, fs.ErrNotExist) {
		return e, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", e.path, err)
	}
	var list []Entry
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("parse %s: %w", e.path, err)
	}
	for _, x := range list {
		if x.Grant == "" { // an entry from before grants: it gets one now
			x.Grant = NewGrant()
		}
		e.by[strings.ToLower(x.MAC)] = x
	}
	return e, nil
}

// ByGrant returns the entry holding grant, comparing in constant time.
func (e *Entries) ByGrant(grant string) (Entry, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var found Entry
	ok := false
	for _, x := range e.by {
		if len(x.Grant) == len(grant) && subtle.ConstantTimeCompare([]byte(x.Grant), []byte(grant)) == 1 {
			found, ok = x, true
		}
	}
	return found, ok
}

func (e *Entries) saveLocked() error {
	list := make([]Entry, 0, len(e.by))
	for _, x := range e.by {
		list = append(list, x)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].MAC < list[j].MAC })
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(e.path, b, 0o600)
}

// Put adds or replaces a machine's entry (one without a grant gets one).
func (e *Entries) Put(x Entry) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	x.MAC = strings.ToLower(x.MAC)
	if x.Grant == "" {
		x.Grant = NewGrant()
	}
	e.by[x.MAC] = x
	return e.saveLocked()
}

// Remove drops a machine's entry; it reports whether there was one.
func (e *Entries) Remove(mac string) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	mac = strings.ToLower(mac)
	if _, ok := e.by[mac]; !ok {
		return false, nil
	}
	delete(e.by, mac)
	return true, e.saveLocked()
}

// Get returns a machine's entry.
func (e *Entries) Get(mac string) (Entry, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.by[strings.ToLower(mac)]
	return x, ok
}

// Digests lists the images the entries name (kept out of eviction).
func (e *Entries) Digests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, x := range e.by {
		for _, d := range []string{x.Kernel, x.Initrd, x.ISO} {
			if d != "" {
				out = append(out, d)
			}
		}
	}
	return out
}

// Lease says whether this site agent holds the site's boot lease.
type Lease interface{ Active() bool }

// Server is the boot server.
type Server struct {
	Boot    config.Boot
	Entries *Entries
	Cache   *imagecache.Cache
	Lease   Lease
	Log     *slog.Logger
	// Discovered is told the MACs of PXE clients nobody prepared (and
	// their architecture, when proxy DHCP read it).
	Discovered func(mac net.HardwareAddr, arch string)
}

// Handler serves /boot/ipxe?mac= and /cache/t/<grant>/images/<digest>.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/cache/t/{grant}/images/{digest}", s.cached)
	mux.HandleFunc("GET /boot/ipxe", s.script)
	return mux
}

// cached serves an image of the cache to the machine holding the grant;
// an unknown grant is 404, as an image not cached is.
func (s *Server) cached(w http.ResponseWriter, r *http.Request) {
	grant := r.PathValue("grant")
	if len(grant) != 32 || strings.Contains(r.URL.RawPath, "%") {
		http.NotFound(w, r)
		return
	}
	e, ok := s.Entries.ByGrant(grant)
	if !ok {
		s.Log.Info("image cache: a request without a valid grant", "remote", r.RemoteAddr)
		http.NotFound(w, r)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = "/images/"+r.PathValue("digest"), ""
	s.Log.Debug("image cache: served under a grant", "mac", e.MAC, "digest", r.PathValue("digest"))
	s.Cache.Handler().ServeHTTP(w, r2)
}

func (s *Server) script(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	mac, err := net.ParseMAC(r.URL.Query().Get("mac"))
	if err != nil || len(mac) != 6 {
		http.Error(w, "mac: a 6-byte MAC is required", http.StatusBadRequest)
		return
	}
	log := s.Log.With("mac", mac.String())
	e, ok := s.Entries.Get(mac.String())
	switch {
	case !s.Lease.Active():
		log.Info("iPXE script refused: this site agent does not hold the boot lease")
		fmt.Fprint(w, ipxe.Exit())
		return
	case !ok:
		log.Info("iPXE script for an unknown machine: exit")
		if s.Discovered != nil {
			s.Discovered(mac, "")
		}
		fmt.Fprint(w, ipxe.Exit())
		return
	}
	base := strings.TrimRight(s.Boot.URL, "/") + CachePath(e.Grant)
	var sc string
	if e.ISO != "" {
		sc, err = ipxe.Sanboot(base + "/images/" + e.ISO)
	} else {
		sc, err = ipxe.Script(ipxe.Boot{Kernel: base + "/images/" + e.Kernel, Initrd: base + "/images/" + e.Initrd, Cmdline: e.Cmdline})
	}
	if err != nil {
		log.Error("iPXE script", "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	log.Info("iPXE script served", "command_id", e.Command)
	fmt.Fprint(w, sc)
}

// Lookup is proxy DHCP's view of the entries.
func (s *Server) Lookup(_ context.Context, mac net.HardwareAddr) (proxydhcp.Entry, bool) {
	if _, ok := s.Entries.Get(mac.String()); !ok {
		return proxydhcp.Entry{}, false
	}
	return proxydhcp.Entry{ScriptURL: strings.TrimRight(s.Boot.URL, "/") + "/boot/ipxe?mac=" + mac.String()}, true
}

// Active is the boot lease.
func (s *Server) Active() bool { return s.Lease.Active() }

// Run serves until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 3)
	n := 0
	hs := &http.Server{Addr: s.Boot.Listen, Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 8 << 10}
	ln, err := net.Listen("tcp", s.Boot.Listen)
	if err != nil {
		return fmt.Errorf("boot server: listen %s: %w", s.Boot.Listen, err)
	}
	n++
	go func() { errc <- hs.Serve(ln) }()
	s.Log.Info("boot server listening", "listen", ln.Addr().String(), "url", s.Boot.URL)
	if s.Boot.ProxyDHCP {
		srv, err := proxydhcp.New(proxydhcp.Config{ServerIP: net.ParseIP(s.Boot.ServerIP), Interface: s.Boot.Interface,
			ScriptURL: strings.TrimRight(s.Boot.URL, "/") + "/boot/ipxe", Backend: s, Log: s.Log,
			Discovered: func(_ context.Context, d proxydhcp.Discovery) {
				if s.Discovered != nil {
					s.Discovered(d.MAC, string(d.Arch))
				}
			}})
		if err != nil {
			hs.Close()
			return fmt.Errorf("boot server: %w", err)
		}
		n++
		go func() { errc <- srv.Serve(ctx) }()
	}
	if s.Boot.TFTP {
		srv, err := tftpd.New(tftpd.Config{Root: s.Boot.TFTPRoot, Log: s.Log})
		if err != nil {
			hs.Close()
			return fmt.Errorf("boot server: %w", err)
		}
		n++
		go func() { errc <- srv.Serve(ctx) }()
	}
	select {
	case <-ctx.Done():
		err = nil
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
