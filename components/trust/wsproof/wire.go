package wsproof

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// RenewBody is POST /v1/renew's body: the node's proof over the challenge
// it asked for (GET /v1/challenge), its nonce and the renewal request.
type RenewBody struct {
	Nonce     []byte `json:"nonce"`
	Challenge []byte `json:"challenge"`
	Proof     Proof  `json:"proof"`
	Request   []byte `json:"request"` // a protobuf RenewRequest
}

// MaxRenewBody bounds RenewBody as JSON: a CSR and a TPM certification
// fit many times over.
const MaxRenewBody = 64 << 10

// DecodeRenew parses a RenewBody strictly.
func DecodeRenew(b []byte, rb *RenewBody) error {
	if len(b) > MaxRenewBody {
		return fmt.Errorf("larger than %d bytes", MaxRenewBody)
	}
	return decode(b, rb)
}

// HTTPError is the body of a refused fallback request.
type HTTPError struct {
	Code  string `json:"code"` // the RPC code's name, e.g. permission_denied
	Error string `json:"error"`
}

// PushbackHeader carries a busy refusal's retry pushback in milliseconds.
const PushbackHeader = "Bcd-Retry-Pushback-Ms"

// HTTPStatus is the HTTP status of an RPC code (connect's numbering).
func HTTPStatus(code uint32) int {
	switch code {
	case 3, 9, 11: // invalid argument, failed precondition, out of range
		return http.StatusBadRequest
	case 16:
		return http.StatusUnauthorized
	case 7:
		return http.StatusForbidden
	case 5:
		return http.StatusNotFound
	case 8:
		return http.StatusTooManyRequests
	case 12:
		return http.StatusNotImplemented
	case 14:
		return http.StatusServiceUnavailable
	case 4:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// WebSocket close codes 4000 to 4016 carry an RPC code (4000 + code).
const closeBase = 4000

// CloseCode is the WebSocket close code that carries an RPC code.
func CloseCode(code uint32) int { return closeBase + int(code) }

// CodeOfClose is the RPC code a close code carries, if any.
func CodeOfClose(status int) (uint32, bool) {
	if status > closeBase && status <= closeBase+16 {
		return uint32(status - closeBase), true
	}
	return 0, false
}

// pushbackPrefix starts a close reason that carries a retry pushback.
const pushbackPrefix = "pushback_ms="

// PushbackReason is a close reason carrying a retry pushback.
func PushbackReason(ms int64, msg string) string {
	return pushbackPrefix + strconv.FormatInt(ms, 10) + " " + msg
}

// ParsePushback reads a close reason's retry pushback, if any, and the
// message after it.
func ParsePushback(reason string) (ms string, msg string) {
	rest, ok := strings.CutPrefix(reason, pushbackPrefix)
	if !ok {
		return "", reason
	}
	ms, msg, _ = strings.Cut(rest, " ")
	if _, err := strconv.ParseUint(ms, 10, 32); err != nil {
		return "", reason
	}
	return ms, msg
}

// TrimReason fits a close reason in a control frame (123 bytes).
func TrimReason(s string) string {
	if len(s) <= 123 {
		return s
	}
	return s[:120] + "..."
}
