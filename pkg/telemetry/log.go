package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// Log attribute keys used across jetfleet: one name per concept.
const (
	LogTraceID    = "trace_id"
	LogSpanID     = "span_id"
	LogJobID      = "job_id"
	LogScheduleID = "schedule_id"
	LogAgentID    = "agent_id"
	LogQueue      = "queue"
	LogKind       = "kind"
	LogComponent  = "component"
	LogError      = "error"
)

// ParseLevel reads debug, info, warn or error; empty means info.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
}

// NewLogger returns a logger writing to w in cfg's format and level, adding
// trace_id and span_id from the context of every record.
func NewLogger(w io.Writer, cfg Config) (*slog.Logger, error) {
	level, err := ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler
	if cfg.LogFormat == "text" {
		h = slog.NewTextHandler(w, opts)
	} else {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(TraceHandler{Handler: h}), nil
}

// TraceHandler adds trace_id and span_id to records logged with a context
// that carries a span.
type TraceHandler struct {
	slog.Handler
}

// Handle implements slog.Handler.
func (h TraceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

// WithAttrs implements slog.Handler.
func (h TraceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return TraceHandler{Handler: h.Handler.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (h TraceHandler) WithGroup(name string) slog.Handler {
	return TraceHandler{Handler: h.Handler.WithGroup(name)}
}
