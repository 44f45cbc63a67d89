package protocol

import (
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// appendJobEvent writes ev in the same canonical proto3 JSON form as
// Marshal (snake_case names, zero values omitted), without reflection: an
// agent writes one event per job, and protojson's reflection was the largest
// client-side cost of a job. TestJobEventEncoderMatchesProtojson holds the
// two encoders together; a field added to JobEvent must be added here.
func appendJobEvent(b []byte, ev *jetfleetpb.JobEvent) []byte {
	w := objectWriter{b: append(b, '{')}
	w.str("type", ev.GetType())
	w.str("job_id", ev.GetJobId())
	w.str("queue", ev.GetQueue())
	w.str("kind", ev.GetKind())
	w.u32("attempt", ev.GetAttempt())
	w.u32("max_attempts", ev.GetMaxAttempts())
	w.str("agent_id", ev.GetAgentId())
	w.ts("time", ev.GetTime())
	w.dur("duration", ev.GetDuration())
	w.str("error", ev.GetError())
	w.str("error_code", ev.GetErrorCode())
	w.dur("retry_in", ev.GetRetryIn())
	w.str("schedule_id", ev.GetScheduleId())
	w.ts("nominal_time", ev.GetNominalTime())
	w.str("trace_id", ev.GetTraceId())
	w.u64("stream_sequence", ev.GetStreamSequence())
	w.str("reason", ev.GetReason())
	w.ts("started_at", ev.GetStartedAt())
	w.u32("snoozes", ev.GetSnoozes())
	w.str("output_tail", ev.GetOutputTail())
	w.u64("delivered", ev.GetDelivered())
	w.f64("progress", ev.GetProgress())
	w.str("progress_message", ev.GetProgressMessage())
	w.bytes("result", ev.GetResult())
	return append(w.b, '}')
}

type objectWriter struct {
	b    []byte
	more bool
}

func (w *objectWriter) name(n string) {
	if w.more {
		w.b = append(w.b, ',')
	}
	w.more = true
	w.b = append(w.b, '"')
	w.b = append(w.b, n...)
	w.b = append(w.b, '"', ':')
}

func (w *objectWriter) str(n, v string) {
	if v == "" {
		return
	}
	w.name(n)
	w.b = appendJSONString(w.b, v)
}

// bytes writes standard base64 with padding, as the canonical mapping does.
func (w *objectWriter) bytes(n string, v []byte) {
	if len(v) == 0 {
		return
	}
	w.name(n)
	w.b = append(w.b, '"')
	w.b = base64.StdEncoding.AppendEncode(w.b, v)
	w.b = append(w.b, '"')
}

func (w *objectWriter) u32(n string, v uint32) {
	if v == 0 {
		return
	}
	w.name(n)
	w.b = strconv.AppendUint(w.b, uint64(v), 10)
}

// u64 writes a 64-bit integer as a string, as the canonical mapping does.
func (w *objectWriter) u64(n string, v uint64) {
	if v == 0 {
		return
	}
	w.name(n)
	w.b = append(w.b, '"')
	w.b = strconv.AppendUint(w.b, v, 10)
	w.b = append(w.b, '"')
}

// f64 writes a double as protojson does: ES6 number formatting, the
// non-finite values as strings, and only zero (not -0) omitted.
func (w *objectWriter) f64(n string, v float64) {
	if math.Float64bits(v) == 0 {
		return
	}
	w.name(n)
	switch {
	case math.IsNaN(v):
		w.b = append(w.b, `"NaN"`...)
		return
	case math.IsInf(v, 1):
		w.b = append(w.b, `"Infinity"`...)
		return
	case math.IsInf(v, -1):
		w.b = append(w.b, `"-Infinity"`...)
		return
	}
	format := byte('f')
	if abs := math.Abs(v); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	w.b = strconv.AppendFloat(w.b, v, format, -1, 64)
	if format == 'e' {
		// e-07 → e-7, as JavaScript writes exponents.
		if k := len(w.b); k >= 4 && w.b[k-4] == 'e' && w.b[k-3] == '-' && w.b[k-2] == '0' {
			w.b[k-2] = w.b[k-1]
			w.b = w.b[:k-1]
		}
	}
}

func (w *objectWriter) ts(n string, v *timestamppb.Timestamp) {
	if v == nil {
		return
	}
	w.name(n)
	t := time.Unix(v.GetSeconds(), int64(v.GetNanos())).UTC()
	w.b = append(w.b, '"')
	w.b = appendDateTime(w.b, t)
	w.b = appendFraction(w.b, int64(v.GetNanos()))
	w.b = append(w.b, 'Z', '"')
}

func (w *objectWriter) dur(n string, v *durationpb.Duration) {
	if v == nil {
		return
	}
	w.name(n)
	secs, nanos := v.GetSeconds(), int64(v.GetNanos())
	w.b = append(w.b, '"')
	if secs < 0 || nanos < 0 {
		w.b = append(w.b, '-')
		secs, nanos = -secs, -nanos
	}
	w.b = strconv.AppendInt(w.b, secs, 10)
	w.b = appendFraction(w.b, nanos)
	w.b = append(w.b, 's', '"')
}

// appendFraction writes nanos (less than a second) as 0, 3, 6 or 9
// fractional digits.
func appendFraction(b []byte, nanos int64) []byte {
	if nanos == 0 {
		return b
	}
	digits := 9
	switch {
	case nanos%1e6 == 0:
		digits = 3
	case nanos%1e3 == 0:
		digits = 6
	}
	var nine [9]byte
	for i := len(nine) - 1; i >= 0; i-- {
		nine[i] = byte('0' + nanos%10)
		nanos /= 10
	}
	b = append(b, '.')
	return append(b, nine[:digits]...)
}

// appendDateTime writes t as 2006-01-02T15:04:05 without parsing a layout
// (two timestamps per job event).
func appendDateTime(b []byte, t time.Time) []byte {
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, "2006-01-02T15:04:05") // protojson refuses these anyway
	}
	hour, minute, second := t.Clock()
	b = appendPadded(b, year, 4)
	b = append(b, '-')
	b = appendPadded(b, int(month), 2)
	b = append(b, '-')
	b = appendPadded(b, day, 2)
	b = append(b, 'T')
	b = appendPadded(b, hour, 2)
	b = append(b, ':')
	b = appendPadded(b, minute, 2)
	b = append(b, ':')
	return appendPadded(b, second, 2)
}

// appendPadded writes v (not negative) in width digits, zero-padded.
func appendPadded(b []byte, v, width int) []byte {
	var digits [4]byte
	for i := width - 1; i >= 0; i-- {
		digits[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, digits[:width]...)
}

const hexDigits = "0123456789abcdef"

// appendJSONString writes s as a JSON string, escaping what JSON requires
// and replacing invalid UTF-8 the way protojson would refuse it.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20 || c == 0x7f:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// ToValidUTF8 replaces invalid UTF-8 with U+FFFD. Documents must hold valid
// UTF-8 (protojson refuses to write anything else), and error messages,
// process output and headers may not.
func ToValidUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
