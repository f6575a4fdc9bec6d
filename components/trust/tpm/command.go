package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The four commands a node key's life needs (TPM2_CreatePrimary,
// TPM2_FlushContext, TPM2_Sign, TPM2_Certify) are framed here by hand
// rather than through go-tpm, whose Execute marshals every command and
// response by reflection and links every session kind (HMAC, policy,
// salted and encrypted sessions, with RSA, AES and the KDFs): about 370 kB
// of bcd helper, which uses none of them, as these commands carry only
// empty password authorizations. The bytes are the ones go-tpm sends
// (TestCommandsMatchGoTPM records both); the structures in the responses
// are read with the package's own bounded reader and checked (checkTemplate,
// VerifyCertify, parseECDSASignature). docs/decisions.md says why.
const (
	stNoSessions = 0x8001 // TPM_ST_NO_SESSIONS
	stSessions   = 0x8002 // TPM_ST_SESSIONS
	rsPW         = 0x40000009

	ccCreatePrimary = 0x00000131
	ccCertify       = 0x00000148
	ccSign          = 0x0000015d
	ccFlushContext  = 0x00000165

	algNull     = 0x0010
	stHashCheck = 0x8024     // TPM_ST_HASHCHECK
	rhNull      = 0x40000007 // TPM_RH_NULL

	// maxTPM2B bounds a size-prefixed buffer of a response; the largest
	// this package reads, a TPM2B_PUBLIC or TPM2B_ATTEST, is well under it.
	maxTPM2B = 4096
)

// command is a TPM command being framed: the header is written by bytes.
type command struct {
	b []byte
}

func newCommand(tag uint16, cc uint32) *command {
	c := &command{b: make([]byte, 10, 128)}
	binary.BigEndian.PutUint16(c.b[0:], tag)
	binary.BigEndian.PutUint32(c.b[6:], cc)
	return c
}

func (c *command) u16(v uint16) { c.b = binary.BigEndian.AppendUint16(c.b, v) }
func (c *command) u32(v uint32) { c.b = binary.BigEndian.AppendUint32(c.b, v) }

func (c *command) tpm2b(v []byte) {
	c.u16(uint16(len(v)))
	c.b = append(c.b, v...)
}

// passwordAuths writes the authorization area of n empty password
// sessions (TPM_RS_PW, no nonce, no attributes, empty password), as
// tpm2.PasswordAuth(nil) does.
func (c *command) passwordAuths(n int) {
	const one = 4 + 2 + 1 + 2
	c.u32(uint32(n * one))
	for range n {
		c.u32(rsPW)
		c.u16(0)             // nonceCaller
		c.b = append(c.b, 0) // sessionAttributes
		c.u16(0)             // hmac: the empty password
	}
}

// bytes ends the command: its size goes into the header.
func (c *command) bytes() []byte {
	binary.BigEndian.PutUint32(c.b[2:], uint32(len(c.b)))
	return c.b
}

// ResponseCode is a TPM's response code other than TPM_RC_SUCCESS.
type ResponseCode uint32

// errObjectMemory is TPM_RC_OBJECT_MEMORY: no slot for another object.
const errObjectMemory = ResponseCode(0x902)

// rcNames names the codes a node key's commands meet in practice.
var rcNames = map[ResponseCode]string{
	0x100: "TPM_RC_INITIALIZE: TPM2_Startup has not been run",
	0x101: "TPM_RC_FAILURE: the TPM is in failure mode",
	0x902: "TPM_RC_OBJECT_MEMORY: out of memory for object contexts",
	0x903: "TPM_RC_SESSION_MEMORY: out of memory for session contexts",
	0x908: "TPM_RC_YIELDED: the TPM has suspended operation",
	0x909: "TPM_RC_CANCELED: the command was canceled",
	0x910: "TPM_RC_REFERENCE_H0: the first handle refers to a transient object that is not loaded",
	0x920: "TPM_RC_NV_RATE: the TPM is rate-limiting NV writes",
	0x921: "TPM_RC_LOCKOUT: the TPM is in dictionary-attack lockout",
	0x922: "TPM_RC_RETRY: the TPM was not able to start the command",
	0x923: "TPM_RC_NV_UNAVAILABLE: NV is unavailable",
}

func (rc ResponseCode) Error() string {
	if s, ok := rcNames[rc]; ok {
		return s
	}
	return fmt.Sprintf("TPM response code %#x", uint32(rc))
}

// run sends cmd and returns the response's handles (nHandles of them) and
// its parameter area. A response code other than success is returned as
// ResponseCode. With sessions, the response must carry nAuths password
// authorizations as the TPM answers them (empty nonce, continueSession
// only, empty hmac), as go-tpm checks.
func (t *TPM) run(cmd []byte, nHandles, nAuths int) ([]uint32, []byte, error) {
	rsp, err := t.tr.Send(cmd)
	if err != nil {
		return nil, nil, err
	}
	return parseResponse(rsp, nHandles, nAuths)
}

func parseResponse(rsp []byte, nHandles, nAuths int) ([]uint32, []byte, error) {
	r := reader{b: rsp}
	tag, size, rc := r.u16(), r.u32(), r.u32()
	if r.err != nil {
		return nil, nil, fmt.Errorf("TPM response: %w", r.err)
	}
	if int(size) != len(rsp) {
		return nil, nil, fmt.Errorf("TPM response is %d bytes, its header says %d", len(rsp), size)
	}
	if rc != 0 {
		return nil, nil, ResponseCode(rc)
	}
	handles := make([]uint32, nHandles)
	for i := range handles {
		handles[i] = r.u32()
	}
	var params []byte
	switch {
	case tag == stNoSessions && nAuths == 0:
		params = r.take(len(r.b), "parameters")
	case tag == stSessions && nAuths > 0:
		n := int(r.u32())
		params = r.take(n, "parameters")
		for range nAuths {
			nonce := r.tpm2b(maxTPM2B, "nonceTPM")
			attrs := r.u8()
			hmac := r.tpm2b(maxTPM2B, "hmac")
			if r.err == nil && (len(nonce) != 0 || attrs != 1 || len(hmac) != 0) {
				r.fail(errors.New("a password session's response authorization is not empty with continueSession"))
			}
		}
		if r.err == nil && len(r.b) != 0 {
			r.fail(fmt.Errorf("%d trailing bytes", len(r.b)))
		}
	default:
		return nil, nil, fmt.Errorf("TPM response has tag %#04x", tag)
	}
	if r.err != nil {
		return nil, nil, fmt.Errorf("TPM response: %w", r.err)
	}
	return handles, params, nil
}

// createPrimaryCmd is TPM2_CreatePrimary under hierarchy with the
// marshalled TPMT_PUBLIC template: an empty sensitive area, no outside
// info, no PCRs.
func createPrimaryCmd(hierarchy uint32, template []byte) []byte {
	c := newCommand(stSessions, ccCreatePrimary)
	c.u32(hierarchy)
	c.passwordAuths(1)
	c.u16(4) // TPM2B_SENSITIVE_CREATE: an empty userAuth and data
	c.u16(0)
	c.u16(0)
	c.tpm2b(template)
	c.u16(0) // outsideInfo
	c.u32(0) // creationPCR: no selections
	return c.bytes()
}

// createPrimaryRsp is what the caller needs of TPM2_CreatePrimary's answer.
type createPrimaryRsp struct {
	handle uint32
	public []byte // TPMT_PUBLIC, the contents of outPublic
	name   []byte // the contents of name
}

func parseCreatePrimary(handles []uint32, params []byte) (*createPrimaryRsp, error) {
	r := reader{b: params}
	pub := r.tpm2b(maxTPM2B, "outPublic")
	r.tpm2b(maxTPM2B, "creationData")
	r.tpm2b(maxTPM2B, "creationHash")
	r.u16() // creationTicket: tag, hierarchy, digest
	r.u32()
	r.tpm2b(maxTPM2B, "creationTicket.digest")
	name := r.tpm2b(maxNameSize, "name")
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%d trailing bytes", len(r.b)))
	}
	if r.err != nil {
		return nil, fmt.Errorf("TPM2_CreatePrimary response: %w", r.err)
	}
	return &createPrimaryRsp{handle: handles[0], public: pub, name: name}, nil
}

// createPrimary runs TPM2_CreatePrimary.
func (t *TPM) createPrimary(hierarchy uint32, template []byte) (*createPrimaryRsp, error) {
	h, p, err := t.run(createPrimaryCmd(hierarchy, template), 1, 1)
	if err != nil {
		return nil, err
	}
	return parseCreatePrimary(h, p)
}

// flushContextCmd is TPM2_FlushContext of handle.
func flushContextCmd(handle uint32) []byte {
	c := newCommand(stNoSessions, ccFlushContext)
	c.u32(handle)
	return c.bytes()
}

// flushContext runs TPM2_FlushContext.
func (t *TPM) flushContext(handle uint32) error {
	_, p, err := t.run(flushContextCmd(handle), 0, 0)
	if err == nil && len(p) != 0 {
		err = fmt.Errorf("TPM2_FlushContext response: %d trailing bytes", len(p))
	}
	return err
}

// signCmd is TPM2_Sign of digest with the key at handle in its own scheme
// (TPM_ALG_NULL) and a null hash check ticket.
func signCmd(handle uint32, digest []byte) []byte {
	c := newCommand(stSessions, ccSign)
	c.u32(handle)
	c.passwordAuths(1)
	c.tpm2b(digest)
	c.u16(algNull) // inScheme
	c.u16(stHashCheck)
	c.u32(rhNull)
	c.u16(0)
	return c.bytes()
}

// sign runs TPM2_Sign and returns the TPMT_SIGNATURE as the TPM answered
// it: the whole parameter area.
func (t *TPM) sign(handle uint32, digest []byte) ([]byte, error) {
	_, p, err := t.run(signCmd(handle, digest), 0, 1)
	return p, err
}

// certifyCmd is TPM2_Certify of the object at object by the key at signer
// over qualifyingData, in the signer's own scheme.
func certifyCmd(object, signer uint32, qualifyingData []byte) []byte {
	c := newCommand(stSessions, ccCertify)
	c.u32(object)
	c.u32(signer)
	c.passwordAuths(2)
	c.tpm2b(qualifyingData)
	c.u16(algNull) // inScheme
	return c.bytes()
}

// certify runs TPM2_Certify and returns the TPMS_ATTEST and the
// TPMT_SIGNATURE as the TPM answered them.
func (t *TPM) certify(object, signer uint32, qualifyingData []byte) (attest, sig []byte, err error) {
	_, p, err := t.run(certifyCmd(object, signer, qualifyingData), 0, 2)
	if err != nil {
		return nil, nil, err
	}
	r := reader{b: p}
	attest = r.tpm2b(maxTPM2B, "certifyInfo")
	if r.err != nil {
		return nil, nil, fmt.Errorf("TPM2_Certify response: %w", r.err)
	}
	return attest, r.b, nil
}
