// Package wire is bcd helper's protocol, shared by the helper and the
// node's client: one JSON request {"v":1,"op":...} per connection, at most
// 4 MiB, answered {"v":1,"ok":true,...} or
// {"v":1,"ok":false,"error":"...","retryable":bool}. Both sides decode
// strictly: one JSON object, every key spelt exactly as defined and given
// once, no unknown key, no null, and version 1 only, so a node and a helper
// of different versions refuse each other rather than guess.
package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/better-compute/bcd/components/helper/filetable"
	"github.com/better-compute/bcd/components/trust/rootsig"
)

// Version is the protocol version this build speaks.
const Version = 1

// Limits.
const (
	MaxRequest   = 4 << 20   // bytes of one request
	MaxResponse  = 64 << 10  // bytes of one answer
	MaxRuleCount = 1_000_000 // firewall.check's rule count
	MaxReason    = 200       // bytes of a reboot reason kept
	MaxSection   = 1 << 20   // bytes of a section sent with its proof
	// MaxDocument is the size of a release manifest document
	// (update.prepare, update.swap), release.MaxDocument.
	MaxDocument = 64 << 10

	// UniqueSize is the size of the unique that names a node key in the
	// TPM (tpm.*), as node.key records it.
	UniqueSize = 32
	// QualifyingDataSize is the size of tpm.certify's qualifying data
	// (a renewal's sha256(csr)).
	QualifyingDataSize = 32
)

// Operations.
const (
	OpFileWrite     = "file.write"
	OpFileRemove    = "file.remove"
	OpFirewallCheck = "firewall.check"
	OpReboot        = "reboot"
	OpSSHReload     = "ssh.reload"
	OpAccessApply   = "access.apply"
	OpGPUReset      = "gpu.reset"
	OpSliceApply    = "slice.apply"
	OpSliceRemove   = "slice.remove"
	OpPing          = "ping"
	OpTPMNodeKey    = "tpm.nodekey"
	OpTPMSign       = "tpm.sign"
	OpTPMAK         = "tpm.ak"
	OpTPMCertify    = "tpm.certify"
	OpTPMRelease    = "tpm.release"

	// Self-update (docs/update.md, "Through bcd helper"): each answers
	// an "update" object (selfupdate's State, Prepared, Upgrade, or
	// {"confirmed":bool} / {"rolled_back":"VERSION"}); update.clear_failed
	// answers nothing.
	OpUpdateStatus      = "update.status"
	OpUpdatePrepare     = "update.prepare"
	OpUpdateSwap        = "update.swap"
	OpUpdateConfirm     = "update.confirm"
	OpUpdateSettle      = "update.settle"
	OpUpdateRollback    = "update.rollback"
	OpUpdateClearFailed = "update.clear_failed"
)

// OpHostUnit runs one host unit (id: its name) as root from the host
// section of a signed spec (section and proof, as access.apply).
const OpHostUnit = "host.unit"

// OpNetPolicyApply loads the instances' network policy: the helper
// renders bcd's nftables tables itself from the NICs of the instances
// section of a signed spec (section and proof, as access.apply) and
// answers the rules loaded and a "netpolicy" object naming each instance
// whose policy it could not express ({"failed":{"<id>":"<reason>"}}).
const OpNetPolicyApply = "netpolicy.apply"

// The libvirt.* operations (docs/instances.md, "Through bcd helper"):
// libvirt.define takes an instance id with the instances section and its
// proof (as access.apply), and the helper renders the domain from the
// section itself; the others take only the id of a domain bcd's metadata
// names. No operation carries domain XML. libvirt.console answers
// "console": true with one descriptor passed beside the answer
// (SCM_RIGHTS): the serial console of that running domain, a
// pseudo-terminal the helper opened as root.
const (
	OpLibvirtDefine   = "libvirt.define"
	OpLibvirtStart    = "libvirt.start"
	OpLibvirtShutdown = "libvirt.shutdown"
	OpLibvirtDestroy  = "libvirt.destroy"
	OpLibvirtSuspend  = "libvirt.suspend"
	OpLibvirtResume   = "libvirt.resume"
	OpLibvirtUndefine = "libvirt.undefine"
	OpLibvirtConsole  = "libvirt.console"
	// OpLibvirtSave saves a running or paused domain's memory into root's
	// own staging directory (the domain stops), and hands a copy to the
	// node as data_dir/instances/<id>/memory.save; libvirt.start then
	// resumes the domain from root's copy.
	OpLibvirtSave = "libvirt.save"
	// OpLibvirtRestore resumes an instance's defined, stopped domain from
	// the saved memory in its directory; like libvirt.define it takes the
	// instances section and its proof, and root renders the domain from
	// the section, taking only QEMU's stream from the node's file.
	OpLibvirtRestore = "libvirt.restore"
	// OpLibvirtAttachDisk hot-adds the instance's identity disk
	// (data_dir/instances/<id>/identity.iso) to its running domain as
	// vdz, read-only; root renders the disk itself from the id.
	OpLibvirtAttachDisk = "libvirt.attach-disk"
)

// IsLibvirtOp reports whether op is one of the libvirt.* operations.
func IsLibvirtOp(op string) bool {
	switch op {
	case OpLibvirtDefine, OpLibvirtStart, OpLibvirtShutdown, OpLibvirtDestroy, OpLibvirtSuspend, OpLibvirtResume, OpLibvirtUndefine, OpLibvirtConsole,
		OpLibvirtSave, OpLibvirtRestore, OpLibvirtAttachDisk:
		return true
	}
	return false
}

// instanceID reports whether id has the shape of an instance id:
// [A-Za-z0-9][A-Za-z0-9_-], 1 to 64 characters.
func instanceID(id string) bool {
	if len(id) == 0 || len(id) > 64 || id[0] == '-' || id[0] == '_' {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

// hostUnitName reports whether id has the shape of host.unit's id: a
// unit's name of [a-z0-9-], 1 to 32 characters. Which units exist is the
// helper's own registry's to say.
func hostUnitName(id string) bool {
	if len(id) == 0 || len(id) > 32 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// UpdateConfirmed is update.confirm's update object.
type UpdateConfirmed struct {
	Confirmed bool `json:"confirmed"`
}

// UpdateRolledBack is update.settle's and update.rollback's update
// object: the version swapped back, "" when none.
type UpdateRolledBack struct {
	RolledBack string `json:"rolled_back"`
}

// NoTPM is how a helper on a host without a TPM refuses every tpm.*
// operation (docs/helper.md, "Operations").
const NoTPM = "node keys in the TPM are not served by this helper (the host has no TPM)"

// NotLoaded is in the refusal of tpm.sign, tpm.certify and tpm.release for
// a unique the helper holds no key for (never announced with tpm.nodekey,
// unloaded as the least recently used, released, or the helper restarted):
// the node sends tpm.nodekey again and retries.
const NotLoaded = "no node key is loaded for this unique (send tpm.nodekey first)"

// Request is one request. Each operation uses only its own fields; Check
// refuses any other.
type Request struct {
	V      int    `json:"v"`
	Op     string `json:"op"`
	Kind   string `json:"kind,omitempty"`   // file.*: a kind of filetable
	ID     string `json:"id,omitempty"`     // file.*: the id, for kinds that take one
	Data   []byte `json:"data,omitempty"`   // file.write: the content (base64 on the wire)
	Rules  *int64 `json:"rules,omitempty"`  // firewall.check: the rule count the node loaded
	Reason string `json:"reason,omitempty"` // reboot: why (cut to 200 bytes by the helper)
	GPU    string `json:"gpu,omitempty"`    // gpu.reset: GPU-<uuid>
	Slice  string `json:"slice,omitempty"`  // slice.*: bcd-alloc-<id>.slice
	CPUs   string `json:"cpus,omitempty"`   // slice.apply: a cpulist (AllowedCPUs)
	Mems   string `json:"mems,omitempty"`   // slice.apply: a cpulist of memory nodes (AllowedMemoryNodes)
	// slice.apply: the slice's memory limit in bytes (MemoryMax); 0: none.
	MemoryMax uint64 `json:"memory_max,omitempty"`
	// tpm.nodekey, tpm.sign, tpm.certify, tpm.release: the 32-byte unique
	// naming the node key (base64 on the wire).
	Unique []byte `json:"unique,omitempty"`
	// access.apply: the access section as the held spec has it (base64
	// on the wire), and the proof of the signed spec it is part of
	// (rootsig.Proof, the one field that is a JSON object): the helper
	// verifies the signature under its own roots, checks the section's
	// digest against it and renders every file from the section.
	Section []byte          `json:"section,omitempty"`
	Proof   json.RawMessage `json:"proof,omitempty"`
	// tpm.sign: a SHA-256, -384 or -512 digest (32, 48 or 64 bytes).
	Digest []byte `json:"digest,omitempty"`
	// tpm.certify: 32 bytes of qualifying data.
	QualifyingData []byte `json:"qualifying_data,omitempty"`
	// update.prepare, update.swap: a signed release manifest document
	// (base64 on the wire), at most MaxDocument bytes.
	Document []byte `json:"document,omitempty"`
}

// Response is one answer. Error and Retryable are set only when OK is
// false; the results only by the operations CheckAnswer names.
type Response struct {
	OK        bool
	Error     string
	Retryable bool
	// Final marks a failed answer as a refusal no retry changes (a
	// release manifest refused: release.FinalError).
	Final     bool
	Update    json.RawMessage // update.*: the answer object, checked by the client
	NetPolicy json.RawMessage // netpolicy.apply: {"failed":{id:reason}}
	// Console: libvirt.console passed one descriptor beside the answer.
	Console bool
	// File is that descriptor: the helper's to send (and close once
	// sent), the client's once received. It is never encoded.
	File      *os.File
	Rules     *int64 // firewall.check: the rules loaded in the three tables
	Loaded    *bool  // firewall.check: the tables are loaded with Rules == the request's rules
	Public    []byte // tpm.nodekey: the node key's TPMT_PUBLIC
	Signature []byte // tpm.sign: ASN.1 DER ECDSA; tpm.certify: the AK's TPMT_SIGNATURE
	Attest    []byte // tpm.certify: the TPMS_ATTEST
	AKPublic  []byte // tpm.ak, tpm.certify: the AK's TPMT_PUBLIC
}

// Failed returns a failed answer.
func Failed(msg string, retryable bool) *Response {
	return &Response{Error: msg, Retryable: retryable}
}

// wireResponse is Response as it is sent: retryable is present exactly
// when ok is false.
type wireResponse struct {
	V         int             `json:"v"`
	OK        bool            `json:"ok"`
	Error     string          `json:"error,omitempty"`
	Retryable *bool           `json:"retryable,omitempty"`
	Final     bool            `json:"final,omitempty"`
	Rules     *int64          `json:"rules,omitempty"`
	Loaded    *bool           `json:"loaded,omitempty"`
	Public    []byte          `json:"public,omitempty"`
	Signature []byte          `json:"signature,omitempty"`
	Attest    []byte          `json:"attest,omitempty"`
	AKPublic  []byte          `json:"ak_public,omitempty"`
	Update    json.RawMessage `json:"update,omitempty"`
	NetPolicy json.RawMessage `json:"netpolicy,omitempty"`
	Console   bool            `json:"console,omitempty"`
}

// valueType is what a key's value must be.
type valueType int

const (
	tString valueType = iota
	tNumber
	tBool
	tObject // a JSON object, decoded strictly by its operation's Check
)

var requestKeys = map[string]valueType{
	"v": tNumber, "op": tString, "kind": tString, "id": tString, "data": tString,
	"rules": tNumber, "reason": tString, "gpu": tString,
	"slice": tString, "cpus": tString, "mems": tString, "memory_max": tNumber,
	"unique": tString, "digest": tString, "qualifying_data": tString,
	"section": tString, "proof": tObject, "document": tString,
}

var responseKeys = map[string]valueType{
	"v": tNumber, "ok": tBool, "error": tString, "retryable": tBool, "rules": tNumber, "loaded": tBool,
	"public": tString, "signature": tString, "attest": tString, "ak_public": tString,
	"final": tBool, "update": tObject, "netpolicy": tObject, "console": tBool,
}

// EncodeRequest checks r and returns its JSON.
func EncodeRequest(r *Request) ([]byte, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding helper request: %w", err)
	}
	if len(b) > MaxRequest {
		return nil, fmt.Errorf("helper request of %d bytes is larger than %d", len(b), MaxRequest)
	}
	return b, nil
}

// DecodeRequest decodes one request strictly: at most MaxRequest bytes,
// exactly one JSON object of known keys each given once, with no null, and
// v equal to Version. It does not check the operation's fields: Check does.
func DecodeRequest(data []byte) (*Request, error) {
	if len(data) > MaxRequest {
		return nil, fmt.Errorf("request larger than %d bytes", MaxRequest)
	}
	if err := strictObject(data, requestKeys, "v", "op"); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	var r Request
	if err := decodeStrict(data, &r); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	if r.V != Version {
		return nil, fmt.Errorf("request: protocol version %d, this helper speaks %d", r.V, Version)
	}
	return &r, nil
}

// EncodeResponse returns the JSON of r.
func EncodeResponse(r *Response) []byte {
	w := wireResponse{V: Version, OK: r.OK}
	if r.OK {
		w.Rules, w.Loaded = r.Rules, r.Loaded
		w.Public, w.Signature, w.Attest, w.AKPublic = r.Public, r.Signature, r.Attest, r.AKPublic
		w.Update, w.NetPolicy, w.Console = r.Update, r.NetPolicy, r.Console
	} else {
		w.Final = r.Final
		msg := r.Error
		if msg == "" {
			msg = "failed"
		}
		w.Error = msg
		retry := r.Retryable
		w.Retryable = &retry
	}
	b, err := json.Marshal(w)
	if err != nil {
		// Only strings, bytes, bools and ints: Marshal cannot fail.
		panic(err)
	}
	return b
}

// DecodeResponse decodes one answer as strictly as DecodeRequest decodes
// a request. A failed answer must carry an error and retryable; a
// successful one neither.
func DecodeResponse(data []byte) (*Response, error) {
	if len(data) > MaxResponse {
		return nil, fmt.Errorf("helper answer larger than %d bytes", MaxResponse)
	}
	if err := strictObject(data, responseKeys, "v", "ok"); err != nil {
		return nil, fmt.Errorf("helper answer: %w", err)
	}
	var w wireResponse
	if err := decodeStrict(data, &w); err != nil {
		return nil, fmt.Errorf("helper answer: %w", err)
	}
	if w.V != Version {
		return nil, fmt.Errorf("helper answer: protocol version %d, this bcd speaks %d", w.V, Version)
	}
	if w.OK {
		if w.Error != "" || w.Retryable != nil || w.Final {
			return nil, errors.New("helper answer: ok with an error")
		}
		return &Response{OK: true, Rules: w.Rules, Loaded: w.Loaded,
			Public: w.Public, Signature: w.Signature, Attest: w.Attest, AKPublic: w.AKPublic, Update: w.Update, NetPolicy: w.NetPolicy,
			Console: w.Console}, nil
	}
	if w.Error == "" || w.Retryable == nil {
		return nil, errors.New("helper answer: failed without an error and retryable")
	}
	if w.Rules != nil || w.Loaded != nil || w.Console || len(w.Public)+len(w.Signature)+len(w.Attest)+len(w.AKPublic)+len(w.Update)+len(w.NetPolicy) > 0 {
		return nil, errors.New("helper answer: failed with results")
	}
	if w.Final && *w.Retryable {
		return nil, errors.New("helper answer: final and retryable")
	}
	return &Response{Error: w.Error, Retryable: *w.Retryable, Final: w.Final}, nil
}

// decodeStrict decodes data into v refusing unknown fields and anything
// after the one value.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// strictObject checks that data is exactly one JSON object whose keys are
// in keys, spelt exactly (encoding/json would match them without regard
// to case), each at most once, with a value of the key's type: no null,
// no nested object or array. Every key of required must be there.
func strictObject(data []byte, keys map[string]valueType, required ...string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("not a JSON object")
	}
	seen := make(map[string]bool, len(keys))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		key, _ := tok.(string)
		want, known := keys[key]
		if !known {
			return fmt.Errorf("unknown field %q", clip(key))
		}
		if seen[key] {
			return fmt.Errorf("field %q given twice", key)
		}
		seen[key] = true
		if want == tObject {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return fmt.Errorf("not JSON: %w", err)
			}
			if len(raw) == 0 || raw[0] != '{' {
				return fmt.Errorf("field %q has the wrong type", key)
			}
			continue
		}
		val, err := dec.Token()
		if err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
		var ok bool
		switch want {
		case tString:
			_, ok = val.(string)
		case tNumber:
			_, ok = val.(json.Number)
		case tBool:
			_, ok = val.(bool)
		}
		if !ok {
			return fmt.Errorf("field %q has the wrong type", key)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return fmt.Errorf("not JSON: %w", err)
	}
	for _, k := range required {
		if !seen[k] {
			return fmt.Errorf("no field %q", k)
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("more than one JSON value")
	}
	return nil
}

// Check refuses a request whose operation is unknown or that carries a
// field its operation does not use, or a value out of bounds. The helper
// runs it on every request, and the client before it sends one.
func (r *Request) Check() error {
	if r.V != Version {
		return fmt.Errorf("protocol version %d, this bcd speaks %d", r.V, Version)
	}
	var allowed string // the fields besides v and op
	switch r.Op {
	case OpFileWrite:
		allowed = "kind id data"
	case OpFileRemove:
		allowed = "kind id"
	case OpFirewallCheck:
		allowed = "rules"
	case OpReboot:
		allowed = "reason"
	case OpGPUReset:
		allowed = "gpu"
	case OpSliceApply:
		allowed = "slice cpus mems memory_max"
	case OpSliceRemove:
		allowed = "slice"
	case OpTPMNodeKey, OpTPMRelease:
		allowed = "unique"
	case OpTPMSign:
		allowed = "unique digest"
	case OpTPMCertify:
		allowed = "unique qualifying_data"
	case OpAccessApply, OpNetPolicyApply:
		allowed = "section proof"
	case OpHostUnit, OpLibvirtDefine, OpLibvirtRestore:
		allowed = "id section proof"
	case OpLibvirtStart, OpLibvirtShutdown, OpLibvirtDestroy, OpLibvirtSuspend, OpLibvirtResume, OpLibvirtUndefine, OpLibvirtConsole,
		OpLibvirtSave, OpLibvirtAttachDisk:
		allowed = "id"
	case OpUpdatePrepare, OpUpdateSwap:
		allowed = "document"
	case OpSSHReload, OpPing, OpTPMAK,
		OpUpdateStatus, OpUpdateConfirm, OpUpdateSettle, OpUpdateRollback, OpUpdateClearFailed:
	default:
		return fmt.Errorf("unknown operation %q", clip(r.Op))
	}
	has := map[string]bool{
		"kind": r.Kind != "", "id": r.ID != "", "data": len(r.Data) > 0,
		"rules": r.Rules != nil, "reason": r.Reason != "", "gpu": r.GPU != "",
		"slice": r.Slice != "", "cpus": r.CPUs != "", "mems": r.Mems != "", "memory_max": r.MemoryMax != 0,
		"unique": len(r.Unique) > 0, "digest": len(r.Digest) > 0, "qualifying_data": len(r.QualifyingData) > 0,
		"section": len(r.Section) > 0, "proof": len(r.Proof) > 0, "document": len(r.Document) > 0,
	}
	for f, set := range has {
		if set && !strings.Contains(" "+allowed+" ", " "+f+" ") {
			return fmt.Errorf("%s takes no %s", r.Op, f)
		}
	}
	switch r.Op {
	case OpFileWrite, OpFileRemove:
		if _, err := filetable.Resolve(r.Kind, r.ID); err != nil {
			return fmt.Errorf("%s: %w", r.Op, err)
		}
		if len(r.Data) > filetable.MaxFileSize {
			return fmt.Errorf("%s: %d bytes is more than %d", r.Op, len(r.Data), filetable.MaxFileSize)
		}
		if strings.HasPrefix(r.Kind, "ssh-") {
			// sshd's files are rendered by the helper from the access
			// section's fields (access.apply), never sent as content.
			return fmt.Errorf("%s: file kind %s is written only by %s", r.Op, r.Kind, OpAccessApply)
		}
	case OpLibvirtStart, OpLibvirtShutdown, OpLibvirtDestroy, OpLibvirtSuspend, OpLibvirtResume, OpLibvirtUndefine, OpLibvirtConsole,
		OpLibvirtSave, OpLibvirtAttachDisk:
		if !instanceID(r.ID) {
			return fmt.Errorf("%s: id must name an instance ([A-Za-z0-9][A-Za-z0-9_-], 1 to 64 characters)", r.Op)
		}
	case OpAccessApply, OpHostUnit, OpNetPolicyApply, OpLibvirtDefine, OpLibvirtRestore:
		if (r.Op == OpLibvirtDefine || r.Op == OpLibvirtRestore) && !instanceID(r.ID) {
			return fmt.Errorf("%s: id must name an instance ([A-Za-z0-9][A-Za-z0-9_-], 1 to 64 characters)", r.Op)
		}
		if r.Op == OpHostUnit && !hostUnitName(r.ID) {
			return fmt.Errorf("%s: id must name a host unit ([a-z0-9-], 1 to 32 characters)", r.Op)
		}
		if len(r.Proof) == 0 {
			return fmt.Errorf("%s: no proof: the section is applied only from a signed spec", r.Op)
		}
		if _, err := rootsig.DecodeProof(r.Proof); err != nil {
			return fmt.Errorf("%s: %w", r.Op, err)
		}
		if len(r.Section) > MaxSection {
			return fmt.Errorf("%s: section of %d bytes is more than %d", r.Op, len(r.Section), MaxSection)
		}
	case OpFirewallCheck:
		if r.Rules == nil || *r.Rules < 0 || *r.Rules > MaxRuleCount {
			return fmt.Errorf("%s: rules must be a count from 0 to %d", r.Op, MaxRuleCount)
		}
	case OpGPUReset:
		if !IsGPUUUID(r.GPU) {
			return fmt.Errorf("%s: gpu must be a GPU-<uuid>", r.Op)
		}
	case OpSliceApply, OpSliceRemove:
		if _, err := SliceID(r.Slice); err != nil {
			return fmt.Errorf("%s: %w", r.Op, err)
		}
		if r.Op == OpSliceApply {
			if r.CPUs == "" && r.Mems == "" && r.MemoryMax == 0 {
				return fmt.Errorf("%s: no cpus, no mems and no memory_max: give at least one", r.Op)
			}
			if r.MemoryMax != 0 && r.MemoryMax < MinMemoryMax {
				return fmt.Errorf("%s: memory_max %d is below %d bytes", r.Op, r.MemoryMax, MinMemoryMax)
			}
			for _, f := range []struct{ name, v string }{{"cpus", r.CPUs}, {"mems", r.Mems}} {
				if f.v == "" {
					continue
				}
				if _, err := ParseCPUList(f.v); err != nil {
					return fmt.Errorf("%s: %s: %w", r.Op, f.name, err)
				}
			}
		}
	case OpUpdatePrepare, OpUpdateSwap:
		if len(r.Document) == 0 {
			return fmt.Errorf("%s: no document", r.Op)
		}
		if len(r.Document) > MaxDocument {
			return fmt.Errorf("%s: document of %d bytes is more than %d", r.Op, len(r.Document), MaxDocument)
		}
	case OpTPMNodeKey, OpTPMSign, OpTPMCertify, OpTPMRelease:
		if len(r.Unique) != UniqueSize {
			return fmt.Errorf("%s: unique is %d bytes, want %d", r.Op, len(r.Unique), UniqueSize)
		}
		switch r.Op {
		case OpTPMSign:
			if n := len(r.Digest); n != 32 && n != 48 && n != 64 {
				return fmt.Errorf("%s: digest is %d bytes, want 32, 48 or 64 (SHA-256, -384, -512)", r.Op, n)
			}
		case OpTPMCertify:
			if n := len(r.QualifyingData); n != QualifyingDataSize {
				return fmt.Errorf("%s: qualifying_data is %d bytes, want %d", r.Op, n, QualifyingDataSize)
			}
		}
	}
	return nil
}

// CheckAnswer checks that a successful answer to op carries exactly the
// results op answers: rules and loaded (firewall.check), public
// (tpm.nodekey), signature (tpm.sign), ak_public (tpm.ak), and attest,
// signature and ak_public (tpm.certify); no other operation answers any.
// The client runs it on every successful answer; what the results say is
// for the caller to check.
func (r *Response) CheckAnswer(op string) error {
	if !r.OK {
		return nil
	}
	var want string
	switch op {
	case OpFirewallCheck:
		want = "rules loaded"
	case OpNetPolicyApply:
		want = "rules netpolicy"
	case OpTPMNodeKey:
		want = "public"
	case OpTPMSign:
		want = "signature"
	case OpTPMAK:
		want = "ak_public"
	case OpTPMCertify:
		want = "attest signature ak_public"
	case OpUpdateStatus, OpUpdatePrepare, OpUpdateSwap, OpUpdateConfirm, OpUpdateSettle, OpUpdateRollback:
		want = "update"
	case OpLibvirtConsole:
		want = "console"
	}
	fields := []struct {
		name string
		set  bool
	}{
		{"rules", r.Rules != nil}, {"loaded", r.Loaded != nil}, {"public", len(r.Public) > 0},
		{"signature", len(r.Signature) > 0}, {"attest", len(r.Attest) > 0}, {"ak_public", len(r.AKPublic) > 0},
		{"update", len(r.Update) > 0}, {"netpolicy", len(r.NetPolicy) > 0}, {"console", r.Console},
	}
	// Another operation's result first, then a missing one, in a fixed order.
	for _, f := range fields {
		if f.set && !strings.Contains(" "+want+" ", " "+f.name+" ") {
			return fmt.Errorf("answer to %s carries %s, which it does not answer", clip(op), f.name)
		}
	}
	for _, f := range fields {
		if !f.set && strings.Contains(" "+want+" ", " "+f.name+" ") {
			return fmt.Errorf("answer to %s carries no %s", clip(op), f.name)
		}
	}
	return nil
}

// CutReason cuts a reboot reason to MaxReason bytes on a UTF-8 boundary.
func CutReason(s string) string {
	if len(s) <= MaxReason {
		return s
	}
	n := MaxReason
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// IsGPUUUID reports whether s is GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
// in lower- or upper-case hex.
func IsGPUUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
	if !ok || len(rest) != 36 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
