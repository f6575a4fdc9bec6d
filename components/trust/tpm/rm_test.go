package tpm

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// resourceManager stands in for the kernel's /dev/tpmrm0 in front of swtpm,
// which (like a real TPM) has room for only three loaded objects: it hands
// out virtual handles for transient objects, keeps each one's saved context
// between commands and loads only those a command names. It knows the
// handful of commands this package sends and records how many objects are
// alive and which ones were flushed.
type resourceManager struct {
	inner transport.TPMCloser

	mu      sync.Mutex
	next    uint32
	objects map[uint32]tpm2.TPMSContext // virtual handle -> saved context
	created int
	flushed []uint32 // virtual handles, in order
}

const virtualBase = 0x80800000

// commandHandles is how many handles each command this package sends has in
// its handle area.
var commandHandles = map[tpm2.TPMCC]int{
	tpm2.TPMCCCreatePrimary:      1,
	tpm2.TPMCCSign:               1,
	tpm2.TPMCCCertify:            2,
	tpm2.TPMCCActivateCredential: 2,
	tpm2.TPMCCNVReadPublic:       1,
	tpm2.TPMCCNVRead:             2,
	tpm2.TPMCCStartAuthSession:   2,
	tpm2.TPMCCPolicySecret:       2,
	tpm2.TPMCCGetCapability:      0,
	tpm2.TPMCCReadPublic:         1,
}

func newResourceManager(inner transport.TPMCloser) *resourceManager {
	return &resourceManager{inner: inner, next: virtualBase, objects: map[uint32]tpm2.TPMSContext{}}
}

func (rm *resourceManager) alive() int {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	return len(rm.objects)
}

func (rm *resourceManager) Close() error { return rm.inner.Close() }

func (rm *resourceManager) Send(cmd []byte) ([]byte, error) {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	if len(cmd) < 10 {
		return nil, fmt.Errorf("resource manager: short command")
	}
	cc := tpm2.TPMCC(binary.BigEndian.Uint32(cmd[6:10]))
	if cc == tpm2.TPMCCFlushContext && len(cmd) == 14 {
		h := binary.BigEndian.Uint32(cmd[10:14])
		if _, ok := rm.objects[h]; ok {
			delete(rm.objects, h)
			rm.flushed = append(rm.flushed, h)
			return []byte{0x80, 0x01, 0, 0, 0, 10, 0, 0, 0, 0}, nil
		}
		if h>>24 == 0x80 {
			return nil, fmt.Errorf("resource manager: flush of unknown object %#x", h)
		}
		return rm.inner.Send(cmd)
	}
	n, ok := commandHandles[cc]
	if !ok {
		return nil, fmt.Errorf("resource manager: command %v is not known to this test", cc)
	}
	if len(cmd) < 10+4*n {
		return nil, fmt.Errorf("resource manager: short command %v", cc)
	}
	cmd = append([]byte(nil), cmd...)
	var loaded []tpm2.TPMHandle
	defer func() {
		for _, h := range loaded {
			tpm2.FlushContext{FlushHandle: h}.Execute(rm.inner)
		}
	}()
	for i := range n {
		off := 10 + 4*i
		h := binary.BigEndian.Uint32(cmd[off:])
		ctx, ok := rm.objects[h]
		if !ok {
			continue
		}
		rsp, err := tpm2.ContextLoad{Context: ctx}.Execute(rm.inner)
		if err != nil {
			return nil, fmt.Errorf("resource manager: TPM2_ContextLoad(%#x) = %w", h, err)
		}
		loaded = append(loaded, rsp.LoadedHandle)
		binary.BigEndian.PutUint32(cmd[off:], uint32(rsp.LoadedHandle))
	}
	rsp, err := rm.inner.Send(cmd)
	if err != nil || cc != tpm2.TPMCCCreatePrimary || len(rsp) < 14 || binary.BigEndian.Uint32(rsp[6:10]) != 0 {
		return rsp, err
	}
	// A new object: save it, unload it and answer a virtual handle.
	phys := tpm2.TPMHandle(binary.BigEndian.Uint32(rsp[10:14]))
	saved, err := tpm2.ContextSave{SaveHandle: phys}.Execute(rm.inner)
	tpm2.FlushContext{FlushHandle: phys}.Execute(rm.inner)
	if err != nil {
		return nil, fmt.Errorf("resource manager: TPM2_ContextSave(%#x) = %w", uint32(phys), err)
	}
	v := rm.next
	rm.next++
	rm.objects[v] = saved.Context
	rm.created++
	rsp = append([]byte(nil), rsp...)
	binary.BigEndian.PutUint32(rsp[10:14], v)
	return rsp, nil
}
