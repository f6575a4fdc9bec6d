// Package tpm keeps bcd's node key in the host's TPM 2.0 and proves it there:
// the node key (an ECDSA P-256 signing key derived again on demand from a
// fixed template and a 32-byte unique that node.key records) and an
// attestation key (AK) that certifies it with TPM2_Certify.
//
// The TPM side (Open, NodeKey, AK, Sign, Certify) talks to /dev/tpmrm0 or, in
// tests, to swtpm, framing its few commands itself (command.go). The
// verifier side (VerifyCertify, ParseAttest, CheckNodeKeyPublic,
// CheckAKPublic) is pure Go and never needs a TPM. The package links no
// go-tpm: bcd helper, which serves the tpm.* operations as root, stays
// small. The endorsement key, its certificate and credential activation,
// which need go-tpm's marshalling and sessions, are in
// components/trust/tpm/ek, on this package's Exec. See docs/tpm.md.
package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultPath is the kernel's TPM resource manager, which virtualizes object
// slots so that several processes can share the TPM.
const DefaultPath = "/dev/tpmrm0"

// MaxLoaded is how many keys a TPM keeps loaded at once. The least recently
// used one is flushed to make room; an unloaded key is derived again from its
// template the next time it is used.
const MaxLoaded = 8

// TPM is an open TPM 2.0 with a small cache of loaded keys. Its methods are
// safe for concurrent use; commands are sent one at a time.
type TPM struct {
	mu     sync.Mutex
	tr     Transport
	loaded []*slot // least recently used first
	closed bool
}

// Transport carries raw TPM commands and answers their responses; go-tpm's
// transport.TPMCloser is one.
type Transport interface {
	Send(cmd []byte) ([]byte, error)
	Close() error
}

// Hierarchies (TPM_RH_*).
const (
	RHOwner       = 0x40000001
	RHNull        = 0x40000007
	RHEndorsement = 0x4000000b
	RHPlatform    = 0x4000000c
)

// object is something the TPM derives again from a hierarchy's seed and a
// template: every key this package uses is a primary object.
type object struct {
	what      string // "node-key template", "AK template", "EK template"
	hierarchy uint32
	tb        []byte // the marshalled TPMT_PUBLIC template
	id        string // hierarchy and marshalled template: the object's identity

	mu     sync.Mutex
	public []byte // TPMT_PUBLIC the TPM answered the first time; nil until then
}

// slot is a loaded object.
type slot struct {
	obj    *object
	handle uint32
	name   []byte // TPM2B_NAME contents
}

func newObject(what string, hierarchy uint32, tb []byte) *object {
	id := make([]byte, 4, 4+len(tb))
	binary.BigEndian.PutUint32(id, uint32(hierarchy))
	return &object{what: what, hierarchy: hierarchy, tb: tb, id: string(append(id, tb...))}
}

// Open opens the TPM device at path (DefaultPath on a host).
func Open(path string) (*TPM, error) {
	tr, err := openDevice(path)
	if err != nil {
		return nil, fmt.Errorf("open TPM %s = %w", path, err)
	}
	return OpenTransport(tr), nil
}

// openDevice opens a TPM character device: each command is one write and
// its response one read.
func openDevice(path string) (Transport, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&os.ModeDevice == 0 {
		return nil, fmt.Errorf("%s is not a device (%s)", path, fi.Mode())
	}
	// Opened blocking, outside Go's poller: os.OpenFile would make a
	// pollable character device O_NONBLOCK, and then the kernel queues
	// the written command and a read before it is answered returns 0
	// bytes (io.EOF), not EAGAIN. Blocking, the write runs the command.
	fd, err := syscall.Open(path, syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return &deviceTransport{f: os.NewFile(uintptr(fd), path)}, nil
}

// deviceTransport is a TPM character device (/dev/tpmrm0).
type deviceTransport struct {
	f *os.File
}

func (d *deviceTransport) Send(cmd []byte) ([]byte, error) {
	if _, err := d.f.Write(cmd); err != nil {
		return nil, fmt.Errorf("write TPM command = %w", err)
	}
	rsp := make([]byte, maxResponse)
	n, err := d.f.Read(rsp)
	if err != nil {
		return nil, fmt.Errorf("read TPM response = %w", err)
	}
	return rsp[:n], nil
}

func (d *deviceTransport) Close() error { return d.f.Close() }

// OpenTransport uses an already open TPM transport; Close closes it.
func OpenTransport(tr Transport) *TPM {
	return &TPM{tr: tr}
}

// OpenTCP connects to a TPM simulator's command port (swtpm socket --server
// type=tcp), which carries raw TPM commands and responses. The simulator must
// already be started up (swtpm --flags not-need-init,startup-clear). addr
// is IP:port (localhost:port is taken as 127.0.0.1): dialling a parsed
// address keeps net's resolver out of the binaries that link this, the
// helper among them (docs/decisions.md).
func OpenTCP(addr string) (*TPM, error) {
	if rest, ok := strings.CutPrefix(addr, "localhost:"); ok {
		addr = "127.0.0.1:" + rest
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("TPM simulator address %q: %w (want IP:port, e.g. 127.0.0.1:2321)", addr, err)
	}
	c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(ap))
	if err != nil {
		return nil, fmt.Errorf("connect to TPM simulator %s = %w", addr, err)
	}
	return OpenTransport(&streamTransport{c: c}), nil
}

// Close flushes every loaded key and closes the transport.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for len(t.loaded) > 0 {
		if err := t.flushLocked(0); err != nil {
			errs = append(errs, err)
		}
	}
	if err := t.tr.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close TPM = %w", err))
	}
	return errors.Join(errs...)
}

// loadLocked returns obj's slot, deriving the object when it is not loaded. The
// caller holds t.mu and uses the slot before releasing it.
func (t *TPM) loadLocked(obj *object) (*slot, error) {
	if t.closed {
		return nil, errors.New("TPM is closed")
	}
	for i, s := range t.loaded {
		if s.obj.id == obj.id {
			copy(t.loaded[i:], t.loaded[i+1:])
			t.loaded[len(t.loaded)-1] = s
			if s.obj != obj {
				// Another Key for the same object loaded it.
				s.obj.mu.Lock()
				pub := s.obj.public
				s.obj.mu.Unlock()
				obj.mu.Lock()
				if obj.public == nil {
					obj.public = pub
				}
				obj.mu.Unlock()
			}
			return s, nil
		}
	}
	for len(t.loaded) >= MaxLoaded {
		if err := t.flushLocked(0); err != nil {
			return nil, err
		}
	}
	var rsp *createPrimaryRsp
	for {
		var err error
		rsp, err = t.createPrimary(obj.hierarchy, obj.tb)
		if err == nil {
			break
		}
		// A TPM without a resource manager (swtpm, /dev/tpm0) has only a
		// few object slots: give one back and try again.
		if errors.Is(err, errObjectMemory) && len(t.loaded) > 0 {
			if ferr := t.flushLocked(0); ferr != nil {
				return nil, ferr
			}
			continue
		}
		return nil, fmt.Errorf("TPM2_CreatePrimary(%s, %s) = %w", hierarchyName(obj.hierarchy), obj.what, err)
	}
	s := &slot{obj: obj, handle: rsp.handle, name: rsp.name}
	pub := rsp.public
	obj.mu.Lock()
	known := obj.public
	if known == nil {
		obj.public = append([]byte(nil), pub...)
	}
	obj.mu.Unlock()
	if known != nil && string(known) != string(pub) {
		t.flushSlot(s)
		return nil, fmt.Errorf("TPM2_CreatePrimary(%s, %s) derived a different key than before: the hierarchy's seed changed (TPM cleared?)",
			hierarchyName(obj.hierarchy), obj.what)
	}
	t.loaded = append(t.loaded, s)
	return s, nil
}

// flushLocked unloads t.loaded[i].
func (t *TPM) flushLocked(i int) error {
	s := t.loaded[i]
	t.loaded = append(t.loaded[:i], t.loaded[i+1:]...)
	return t.flushSlot(s)
}

func (t *TPM) flushSlot(s *slot) error {
	if err := t.flushContext(s.handle); err != nil {
		return fmt.Errorf("TPM2_FlushContext(%#x, %s) = %w", uint32(s.handle), s.obj.what, err)
	}
	return nil
}

// release unloads obj when it is loaded.
func (t *TPM) release(obj *object) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	for i, s := range t.loaded {
		if s.obj.id == obj.id {
			return t.flushLocked(i)
		}
	}
	return nil
}

// derive loads obj once so that its public area is known.
func (t *TPM) derive(obj *object) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := t.loadLocked(obj)
	return err
}

func hierarchyName(h uint32) string {
	switch h {
	case RHOwner:
		return "owner"
	case RHEndorsement:
		return "endorsement"
	case RHPlatform:
		return "platform"
	case RHNull:
		return "null"
	}
	return fmt.Sprintf("%#x", uint32(h))
}

// maxResponse bounds a TPM response; real ones are at most a few KiB.
const maxResponse = 64 << 10

// streamTransport frames TPM commands over a byte stream such as swtpm's TCP
// command port: a response is its 10-byte header and the rest of the size the
// header gives.
type streamTransport struct {
	c net.Conn
}

// commandTimeout bounds one command; RSA key generation on a slow TPM takes
// seconds, not minutes.
const commandTimeout = 2 * time.Minute

func (s *streamTransport) Send(cmd []byte) ([]byte, error) {
	if err := s.c.SetDeadline(time.Now().Add(commandTimeout)); err != nil {
		return nil, err
	}
	if _, err := s.c.Write(cmd); err != nil {
		return nil, fmt.Errorf("write TPM command = %w", err)
	}
	hdr := make([]byte, 10, 256)
	if _, err := io.ReadFull(s.c, hdr); err != nil {
		return nil, fmt.Errorf("read TPM response header = %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[2:6])
	if size < 10 || size > maxResponse {
		return nil, fmt.Errorf("TPM response header gives size %d", size)
	}
	rsp := append(hdr, make([]byte, size-10)...)
	if _, err := io.ReadFull(s.c, rsp[10:]); err != nil {
		return nil, fmt.Errorf("read TPM response = %w", err)
	}
	return rsp, nil
}

func (s *streamTransport) Close() error { return s.c.Close() }

// Object is a primary object the TPM derives again from its template
// whenever it is needed, such as the EK (components/trust/tpm/ek).
type Object struct {
	o *object
}

// NewObject is the primary object template (a marshalled TPMT_PUBLIC)
// derives under hierarchy; what names it in errors ("EK template").
func NewObject(what string, hierarchy uint32, template []byte) *Object {
	return &Object{o: newObject(what, hierarchy, append([]byte(nil), template...))}
}

// Public derives o when the TPM has not yet and returns its public area
// (TPMT_PUBLIC) as the TPM first answered it.
func (t *TPM) Public(o *Object) ([]byte, error) {
	if err := t.derive(o.o); err != nil {
		return nil, err
	}
	o.o.mu.Lock()
	defer o.o.mu.Unlock()
	return append([]byte(nil), o.o.public...), nil
}

// Exec runs fn with the TPM to itself, for the commands this package does
// not frame (the EK's NV reads and credential activation, through go-tpm
// in components/trust/tpm/ek).
func (t *TPM) Exec(fn func(tr Transport) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return errors.New("TPM is closed")
	}
	return fn(t.tr)
}

// ExecLoaded loads the key k (of this TPM) and o, and runs fn with the TPM
// to itself and both loaded: their handles and names.
func (t *TPM) ExecLoaded(k *Key, o *Object, fn func(tr Transport, kh, oh uint32, kname, oname []byte) error) error {
	if k == nil || k.t != t {
		return errors.New("the key is not of this TPM")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ks, os, err := t.loadPairLocked(k.obj, o.o)
	if err != nil {
		return err
	}
	return fn(t.tr, ks.handle, os.handle, ks.name, os.name)
}
