package agentcmd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/better-compute/bcd/components/base/logging"
)

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// lineHandler writes each record as one line for a person:
// "bcd join: join failed; retrying: attempt 2, retry in 1.2s: unavailable: ...".
type lineHandler struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
	level  string
	attrs  []slog.Attr
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool {
	min, err := logging.ParseLevel(h.level)
	if err != nil {
		min = slog.LevelInfo
	}
	return l >= min
}

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var parts []string
	var errText string
	add := func(a slog.Attr) {
		switch a.Key {
		case "component":
		case "err":
			errText = a.Value.String()
		default:
			parts = append(parts, strings.ReplaceAll(a.Key, "_", " ")+" "+a.Value.String())
		}
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool { add(a); return true })
	line := h.prefix + ": " + r.Message
	if len(parts) > 0 {
		line += ": " + strings.Join(parts, ", ")
	}
	if errText != "" {
		line += ": " + errText
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := fmt.Fprintln(h.w, line)
	return err
}

func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &lineHandler{w: h.w, prefix: h.prefix, level: h.level, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h *lineHandler) WithGroup(string) slog.Handler { return h }
