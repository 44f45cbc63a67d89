package fleettest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"
)

// Logs records the log records of the loggers it wraps, so a test can wait
// for a step that no event announces, or check that one never came.
type Logs struct {
	mu   sync.Mutex
	recs []LogRecord
	cond chan struct{}
}

// LogRecord is one record: its message and attributes as strings.
type LogRecord struct {
	Msg   string
	Attrs map[string]string
}

// NewLogs returns an empty recorder.
func NewLogs() *Logs { return &Logs{cond: make(chan struct{})} }

// Wrap returns logger, also recording into l.
func (l *Logs) Wrap(logger *slog.Logger) *slog.Logger {
	return slog.New(recordingHandler{Handler: logger.Handler(), logs: l})
}

func (l *Logs) add(r LogRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	close(l.cond)
	l.cond = make(chan struct{})
}

// MatchLog selects records by message and attributes (key, value pairs).
func MatchLog(msg string, attrs ...string) func(LogRecord) bool {
	return func(r LogRecord) bool {
		if r.Msg != msg {
			return false
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if r.Attrs[attrs[i]] != attrs[i+1] {
				return false
			}
		}
		return true
	}
}

// Count returns how many records so far match.
func (l *Logs) Count(m func(LogRecord) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if m(r) {
			n++
		}
	}
	return n
}

// Wait returns the first record that matches, waiting up to timeout.
func (l *Logs) Wait(t testing.TB, timeout time.Duration, what string, m func(LogRecord) bool) LogRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, ok := l.Await(ctx, m)
	if !ok {
		t.Fatalf("no log record %s within %s", what, timeout)
	}
	return r
}

// Await returns the first record that matches, or false when ctx ends.
func (l *Logs) Await(ctx context.Context, m func(LogRecord) bool) (LogRecord, bool) {
	for {
		l.mu.Lock()
		for _, r := range l.recs {
			if m(r) {
				l.mu.Unlock()
				return r, true
			}
		}
		cond := l.cond
		l.mu.Unlock()
		select {
		case <-cond:
		case <-ctx.Done():
			return LogRecord{}, false
		}
	}
}

// recordingHandler records every record it handles into logs.
type recordingHandler struct {
	slog.Handler
	logs  *Logs
	attrs []slog.Attr
}

func (h recordingHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := LogRecord{Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.logs.add(rec)
	return h.Handler.Handle(ctx, r)
}

func (h recordingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return recordingHandler{Handler: h.Handler.WithAttrs(attrs), logs: h.logs, attrs: append(slices.Clone(h.attrs), attrs...)}
}

func (h recordingHandler) WithGroup(name string) slog.Handler {
	return recordingHandler{Handler: h.Handler.WithGroup(name), logs: h.logs, attrs: h.attrs}
}
