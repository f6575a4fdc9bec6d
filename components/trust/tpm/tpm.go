// Package tpm keeps bcd's node key in the host's TPM 2.0 and proves it there:
// the node key (an ECDSA P-256 signing key derived again on demand from a
// fixed template and a 32-byte unique that node.key records), an attestation
// key (AK) that certifies it with TPM2_Certify, the endorsement key (EK) and
// its certificate, and credential activation, which shows a verifier that
// the AK lives in the TPM that holds the EK.
//
// The TPM side (Open, NodeKey, AK, Certify, EK, ActivateCredential) talks to
// /dev/tpmrm0 or, in tests, to swtpm. The verifier side (VerifyCertify,
// ParseAttest, CheckNodeKeyPublic, CheckAKPublic, MakeCredential) is pure Go
// and never needs a TPM. See docs/tpm.md.
package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
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
	tr     transport.TPMCloser
	loaded []*slot // least recently used first
	closed bool

	ek     *object // chosen on first use, see ekObject
	ekCert []byte
	ekIdx  uint32
}

// object is something the TPM derives again from a hierarchy's seed and a
// template: every key this package uses is a primary object.
type object struct {
	what      string // "node-key template", "AK template", "EK template"
	hierarchy tpm2.TPMHandle
	tb        []byte // the marshalled TPMT_PUBLIC template
	policy    bool   // the template has an authPolicy (an EK's)
	id        string // hierarchy and marshalled template: the object's identity

	mu     sync.Mutex
	public []byte // TPMT_PUBLIC the TPM answered the first time; nil until then
}

// slot is a loaded object.
type slot struct {
	obj    *object
	handle tpm2.TPMHandle
	name   []byte // TPM2B_NAME contents
}

func newObject(what string, hierarchy tpm2.TPMHandle, tb []byte) *object {
	id := make([]byte, 4, 4+len(tb))
	binary.BigEndian.PutUint32(id, uint32(hierarchy))
	return &object{what: what, hierarchy: hierarchy, tb: tb, id: string(append(id, tb...))}
}

// Open opens the TPM device at path (DefaultPath on a host).
func Open(path string) (*TPM, error) {
	tr, err := linuxtpm.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open TPM %s = %w", path, err)
	}
	return OpenTransport(tr), nil
}

// OpenTransport uses an already open TPM transport; Close closes it.
func OpenTransport(tr transport.TPMCloser) *TPM {
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
		rsp, err = t.createPrimary(uint32(obj.hierarchy), obj.tb)
		if err == nil {
			break
		}
		// A TPM without a resource manager (swtpm, /dev/tpm0) has only a
		// few object slots: give one back and try again.
		if errors.Is(err, tpm2.TPMRCObjectMemory) && len(t.loaded) > 0 {
			if ferr := t.flushLocked(0); ferr != nil {
				return nil, ferr
			}
			continue
		}
		return nil, fmt.Errorf("TPM2_CreatePrimary(%s, %s) = %w", hierarchyName(obj.hierarchy), obj.what, err)
	}
	s := &slot{obj: obj, handle: tpm2.TPMHandle(rsp.handle), name: rsp.name}
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
	if err := t.flushContext(uint32(s.handle)); err != nil {
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

func hierarchyName(h tpm2.TPMHandle) string {
	switch h {
	case tpm2.TPMRHOwner:
		return "owner"
	case tpm2.TPMRHEndorsement:
		return "endorsement"
	case tpm2.TPMRHPlatform:
		return "platform"
	case tpm2.TPMRHNull:
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
