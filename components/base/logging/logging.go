// Package logging builds the structured loggers bcd components are handed:
// log/slog writing JSON lines (or text) at a configured level, each keyed
// by the component that logs. Loggers are passed in, never global.
package logging

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// ParseLevel maps debug, info, warn and error to a slog level. The empty
// string is info, the default.
func ParseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "", "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("parsing log level %q: must be debug, info, warn or error", s)
}

// New returns a logger writing to w at level, as JSON lines (format "json"
// or "") or as key=value text (format "text"). Every record carries the
// attribute component=component unless component is empty.
func New(w io.Writer, level, format string, component string) (*slog.Logger, error) {
	if w == nil {
		return nil, errors.New("creating logger: no writer")
	}
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("creating logger: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	switch format {
	case "", "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("creating logger: log format %q: must be json or text", format)
	}
	log := slog.New(h)
	if component != "" {
		log = log.With("component", component)
	}
	return log, nil
}
