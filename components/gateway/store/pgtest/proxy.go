package pgtest

import (
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// Proxy stands between a gateway and the cluster's unix socket, so a test
// can take the database away from one gateway (Cut) and give it back
// (Open) while the other gateways keep theirs.
type Proxy struct {
	dir, target string
	mu          sync.Mutex
	ln          net.Listener
	conns       []net.Conn
}

// NewProxy proxies the socket of the database at dbURL (a URL of this
// package's clusters) and returns the URL that goes through it. The proxy
// is cut when the test ends.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	p := &Proxy{dir: t.TempDir(), target: filepath.Join(q.Get("host"), ".s.PGSQL.5432")}
	q.Set("host", p.dir)
	u.RawQuery = q.Encode()
	p.Open(t)
	t.Cleanup(p.Cut)
	return p, u.String()
}

// Dir is the directory of the proxy's socket (the URL's host).
func (p *Proxy) Dir() string { return p.dir }

// Open listens again after Cut.
func (p *Proxy) Open(t testing.TB) {
	t.Helper()
	path := filepath.Join(p.dir, ".s.PGSQL.5432")
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d, err := net.Dial("unix", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.ln != ln {
				// Cut came between this Accept and here: a connection
				// kept past it would let the database answer while the
				// test says it is gone.
				p.mu.Unlock()
				c.Close()
				d.Close()
				return
			}
			p.conns = append(p.conns, c, d)
			p.mu.Unlock()
			go func() { io.Copy(d, c); d.Close() }()
			go func() { io.Copy(c, d); c.Close() }()
		}
	}()
}

// Cut closes the socket and every connection through it: the database is
// gone for whoever dialled the proxy.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.ln, p.conns = nil, nil
}
