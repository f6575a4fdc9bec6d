// Package sshspec is the SSH part of the access section as fields (the
// user CA, principals per local account, revoked serials and key ids) and
// their checks: no field may carry a newline, a control character or an
// sshd keyword, names keep to a small character set. It touches nothing;
// bcgw, the node and bcd helper (components/helper/sshaccess, which
// renders and applies the files) share it. docs/access.md describes it.
package sshspec

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/components/base/strictjson"
	"slices"
	"sort"
	"strings"
)

// Limits of a Spec.
const (
	MaxCALine       = 16 << 10
	MaxAccounts     = 64
	MaxPrincipals   = 32 // per account
	MaxNameLen      = 64
	MaxRevoked      = 10000 // serials and key ids together
	MaxSpecJSONSize = 1 << 20
)

// ErrInvalid is wrapped by every refusal of a Spec's fields.
var ErrInvalid = errors.New("invalid access section")

// Spec is the SSH part of the access section.
type Spec struct {
	// UserCA is the user CA's public key in authorized_keys form
	// ("ssh-ed25519 AAAA... comment"); empty: no SSH access at all.
	UserCA string `json:"user_ca,omitempty"`
	// Principals maps a local account to the certificate principals it
	// accepts (AuthorizedPrincipalsFile).
	Principals map[string][]string `json:"principals,omitempty"`
	// RevokedSerials and RevokedKeyIDs are certificates of UserCA that
	// sshd refuses (RevokedKeys, a KRL the helper renders).
	RevokedSerials []uint64 `json:"revoked_serials,omitempty"`
	RevokedKeyIDs  []string `json:"revoked_key_ids,omitempty"`
}

// Empty reports whether s asks for no SSH access: every file is removed.
func (s Spec) Empty() bool {
	return s.UserCA == "" && len(s.Principals) == 0 && len(s.RevokedSerials) == 0 && len(s.RevokedKeyIDs) == 0
}

var specKeys = []string{"user_ca", "principals", "revoked_serials", "revoked_key_ids"}

// Decode decodes a Spec strictly: one JSON object of exactly these keys
// (spelt exactly: encoding/json alone would match them without regard to
// case), then Check.
func Decode(data []byte) (Spec, error) {
	var s Spec
	if len(data) > MaxSpecJSONSize {
		return s, fmt.Errorf("%w: more than %d bytes", ErrInvalid, MaxSpecJSONSize)
	}
	var raw map[string]json.RawMessage
	if err := strict(data, &raw); err != nil {
		return s, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for k := range raw {
		if !slices.Contains(specKeys, k) {
			return s, fmt.Errorf("%w: unknown field %q", ErrInvalid, clip(k))
		}
	}
	if err := strict(data, &s); err != nil {
		return s, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return s, s.Check()
}

// Encode returns s's JSON after checking it.
func (s Spec) Encode() ([]byte, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

func strict(data []byte, v any) error { return strictjson.Decode(data, v) }

// Check refuses a Spec any of whose fields could inject a line into sshd's
// configuration or a file sshd reads (a newline, any control character,
// an sshd keyword, a character outside the names' set), or that is out of
// bounds. It touches nothing; Apply also checks the accounts on the host.
func (s Spec) Check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	if s.UserCA == "" && !s.Empty() {
		return bad("principals or revocations without user_ca")
	}
	if s.UserCA != "" {
		if _, _, err := ParseCA(s.UserCA); err != nil {
			return fmt.Errorf("%w: user_ca: %v", ErrInvalid, err)
		}
	}
	if len(s.Principals) > MaxAccounts {
		return bad("%d accounts, at most %d", len(s.Principals), MaxAccounts)
	}
	for acct, ps := range s.Principals {
		if err := checkName(acct, false); err != nil {
			return bad("account %q: %v", clip(acct), err)
		}
		if len(ps) == 0 {
			return bad("account %s: no principals (leave the account out instead)", acct)
		}
		if len(ps) > MaxPrincipals {
			return bad("account %s: %d principals, at most %d", acct, len(ps), MaxPrincipals)
		}
		seen := map[string]bool{}
		for _, p := range ps {
			if err := checkName(p, true); err != nil {
				return bad("account %s: principal %q: %v", acct, clip(p), err)
			}
			if seen[p] {
				return bad("account %s: principal %s given twice", acct, p)
			}
			seen[p] = true
		}
	}
	if n := len(s.RevokedSerials) + len(s.RevokedKeyIDs); n > MaxRevoked {
		return bad("%d revocations, at most %d", n, MaxRevoked)
	}
	for _, n := range s.RevokedSerials {
		if n == 0 {
			return bad("revoked serial 0: sshd cannot revoke serial 0 (bcgw ssh-sign never issues it)")
		}
	}
	for _, id := range s.RevokedKeyIDs {
		if err := checkName(id, true); err != nil {
			return bad("revoked key id %q: %v", clip(id), err)
		}
	}
	return nil
}

// checkName allows [A-Za-z0-9._@-] (and ':' in principals and key ids),
// 1 to 64 characters, not starting with '-' or '.', and never an sshd
// keyword.
func checkName(s string, colon bool) error {
	if len(s) == 0 || len(s) > MaxNameLen {
		return fmt.Errorf("must be 1 to %d characters", MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < 0x20 || c == 0x7f:
			return errors.New("carries a control character (a newline would inject an sshd line)")
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '@':
		case c == '.' || c == '-':
			if i == 0 {
				return fmt.Errorf("starts with %q", c)
			}
		case c == ':' && colon:
		default:
			return fmt.Errorf("has %q: only letters, digits and . _ @ - are allowed", c)
		}
	}
	if IsKeyword(s) {
		return fmt.Errorf("is the sshd keyword %s", s)
	}
	return nil
}

// caTypes are the user CA key types sshd accepts in TrustedUserCAKeys.
var caTypes = []string{
	"ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
	"ssh-rsa", "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
}

// ParseCA reads an authorized_keys line "type base64 [comment]": the type
// one of caTypes, the base64 a key blob whose own first field names the
// same type. The comment is dropped (Render writes "type base64"); it may
// carry no control character or sshd keyword either, since a section
// carrying one is refused whole.
func ParseCA(line string) (typ string, blob []byte, err error) {
	if len(line) > MaxCALine {
		return "", nil, fmt.Errorf("more than %d bytes", MaxCALine)
	}
	for i := 0; i < len(line); i++ {
		if c := line[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return "", nil, errors.New("carries a control character (a newline would inject an sshd line)")
		}
	}
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return "", nil, errors.New(`not "type base64 [comment]"`)
	}
	for _, f := range fields {
		if IsKeyword(f) {
			return "", nil, fmt.Errorf("carries the sshd keyword %s", f)
		}
	}
	typ = fields[0]
	if !slices.Contains(caTypes, typ) {
		return "", nil, fmt.Errorf("key type %q is not one of %s", clip(typ), strings.Join(caTypes, ", "))
	}
	blob, err = base64.StdEncoding.Strict().DecodeString(fields[1])
	if err != nil {
		return "", nil, fmt.Errorf("key is not base64: %v", err)
	}
	if len(blob) < 4 {
		return "", nil, errors.New("key blob too short")
	}
	n := binary.BigEndian.Uint32(blob)
	if uint64(n) > uint64(len(blob)-4) || string(blob[4:4+n]) != typ {
		return "", nil, fmt.Errorf("key blob is not a %s key", typ)
	}
	return typ, blob, nil
}

// Accounts lists s's accounts in order.
func (s Spec) Accounts() []string {
	out := make([]string, 0, len(s.Principals))
	for a := range s.Principals {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
