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

// decodeJobEvent reads data into ev (which it resets) when data is in the
// form appendJobEvent writes — snake_case names, strings without escapes,
// canonical numbers, timestamps and durations — and reports false for
// anything else, which Unmarshal then leaves to protojson. Every reader of
// job events (the supervisor's history, trends and workflows, the
// dashboard) decodes one per job, and protojson's reflection was the
// largest part of the supervisor's work. Whatever it accepts, protojson
// accepts with the same result: FuzzJobEventDecoderAgreesWithProtojson
// holds the two together; a field added to JobEvent must be added here.
func decodeJobEvent(data []byte, ev *jetfleetpb.JobEvent) bool {
	ev.Reset()
	d := eventDecoder{b: data}
	if !d.expect('{') {
		return false
	}
	var seen uint32 // one bit per field: protojson refuses a repeated one
	first := true
	for {
		d.space()
		if d.at('}') {
			d.i++
			break
		}
		if !first && !d.expect(',') {
			return false
		}
		first = false
		d.space()
		name, ok := d.plainString()
		if !ok || !d.expect(':') {
			return false
		}
		d.space()
		field, ok := d.field(name, ev)
		if !ok || seen&(1<<field) != 0 {
			return false
		}
		seen |= 1 << field
	}
	d.space()
	return d.i == len(d.b)
}

// field reads the value of the field named name into ev and returns the
// field's number.
func (d *eventDecoder) field(name string, ev *jetfleetpb.JobEvent) (int, bool) {
	var ok bool
	switch name {
	case "type":
		ev.Type, ok = d.plainString()
		return 1, ok
	case "job_id":
		ev.JobId, ok = d.plainString()
		return 2, ok
	case "queue":
		ev.Queue, ok = d.plainString()
		return 3, ok
	case "kind":
		ev.Kind, ok = d.plainString()
		return 4, ok
	case "attempt":
		ev.Attempt, ok = d.uint32()
		return 5, ok
	case "max_attempts":
		ev.MaxAttempts, ok = d.uint32()
		return 6, ok
	case "agent_id":
		ev.AgentId, ok = d.plainString()
		return 7, ok
	case "time":
		ev.Time, ok = d.timestamp()
		return 8, ok
	case "duration":
		ev.Duration, ok = d.duration()
		return 9, ok
	case "error":
		ev.Error, ok = d.plainString()
		return 10, ok
	case "error_code":
		ev.ErrorCode, ok = d.plainString()
		return 11, ok
	case "retry_in":
		ev.RetryIn, ok = d.duration()
		return 12, ok
	case "schedule_id":
		ev.ScheduleId, ok = d.plainString()
		return 13, ok
	case "nominal_time":
		ev.NominalTime, ok = d.timestamp()
		return 14, ok
	case "trace_id":
		ev.TraceId, ok = d.plainString()
		return 15, ok
	case "stream_sequence":
		ev.StreamSequence, ok = d.uint64()
		return 16, ok
	case "reason":
		ev.Reason, ok = d.plainString()
		return 17, ok
	case "started_at":
		ev.StartedAt, ok = d.timestamp()
		return 18, ok
	case "snoozes":
		ev.Snoozes, ok = d.uint32()
		return 19, ok
	case "output_tail":
		ev.OutputTail, ok = d.plainString()
		return 20, ok
	case "delivered":
		ev.Delivered, ok = d.uint64()
		return 21, ok
	case "progress":
		ev.Progress, ok = d.float64()
		return 22, ok
	case "progress_message":
		ev.ProgressMessage, ok = d.plainString()
		return 23, ok
	case "result":
		ev.Result, ok = d.base64()
		return 24, ok
	}
	return 0, false // a camelCase or unknown name: protojson's
}

type eventDecoder struct {
	b []byte
	i int
}

func (d *eventDecoder) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *eventDecoder) at(c byte) bool { return d.i < len(d.b) && d.b[d.i] == c }

func (d *eventDecoder) expect(c byte) bool {
	d.space()
	if !d.at(c) {
		return false
	}
	d.i++
	return true
}

// plainString reads a string without escapes or control characters, in
// valid UTF-8.
func (d *eventDecoder) plainString() (string, bool) {
	raw, ok := d.rawString()
	if !ok {
		return "", false
	}
	return string(raw), true
}

func (d *eventDecoder) rawString() ([]byte, bool) {
	if !d.at('"') {
		return nil, false
	}
	start := d.i + 1
	ascii := true
	for i := start; i < len(d.b); i++ {
		c := d.b[i]
		switch {
		case c == '"':
			raw := d.b[start:i]
			if !ascii && !utf8.Valid(raw) {
				return nil, false
			}
			d.i = i + 1
			return raw, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// digits reads a canonical unsigned integer: no sign, no leading zero, no
// fraction or exponent.
func (d *eventDecoder) digits() ([]byte, bool) {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	n := d.b[start:d.i]
	if len(n) == 0 || len(n) > 20 || (n[0] == '0' && len(n) > 1) || d.at('.') || d.at('e') || d.at('E') {
		return nil, false
	}
	return n, true
}

func (d *eventDecoder) uint32() (uint32, bool) {
	n, ok := d.digits()
	if !ok {
		return 0, false
	}
	v, err := strconv.ParseUint(string(n), 10, 32)
	return uint32(v), err == nil
}

// uint64 reads a 64-bit integer as a string, as the canonical mapping
// writes it, or as a number.
func (d *eventDecoder) uint64() (uint64, bool) {
	quoted := d.at('"')
	if quoted {
		d.i++
	}
	n, ok := d.digits()
	if !ok || (quoted && !d.expectQuote()) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(n), 10, 64)
	return v, err == nil
}

func (d *eventDecoder) expectQuote() bool {
	if !d.at('"') {
		return false
	}
	d.i++
	return true
}

// float64 reads a finite number in JSON's grammar; the non-finite values,
// written as strings, are protojson's.
func (d *eventDecoder) float64() (float64, bool) {
	start := d.i
	if d.at('-') {
		d.i++
	}
	intStart := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	if d.i == intStart || (d.b[intStart] == '0' && d.i-intStart > 1) {
		return 0, false
	}
	if d.at('.') {
		d.i++
		if !d.moreDigits() {
			return 0, false
		}
	}
	if d.at('e') || d.at('E') {
		d.i++
		if d.at('+') || d.at('-') {
			d.i++
		}
		if !d.moreDigits() {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(string(d.b[start:d.i]), 64)
	return v, err == nil && !math.IsInf(v, 0)
}

func (d *eventDecoder) moreDigits() bool {
	start := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	return d.i > start
}

// timestamp reads an RFC 3339 time with the checks protojson makes: in the
// range a Timestamp holds, at most nine fractional digits.
func (d *eventDecoder) timestamp() (*timestamppb.Timestamp, bool) {
	raw, ok := d.rawString()
	if !ok {
		return nil, false
	}
	s := string(raw)
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, false
	}
	const minSeconds, maxSeconds = -62135596800, 253402300799 // 0001-01-01 to 9999-12-31
	secs := t.Unix()
	if secs < minSeconds || secs > maxSeconds {
		return nil, false
	}
	if i, j := strings.LastIndexByte(s, '.'), strings.LastIndexAny(s, "Z-+"); i >= 0 && j >= i && j-i > len(".999999999") {
		return nil, false
	}
	return &timestamppb.Timestamp{Seconds: secs, Nanos: int32(t.Nanosecond())}, true
}

// duration reads the canonical form: an optional minus, whole seconds
// without a leading zero, one to nine fractional digits, "s".
func (d *eventDecoder) duration() (*durationpb.Duration, bool) {
	raw, ok := d.rawString()
	if !ok || len(raw) < 2 || raw[len(raw)-1] != 's' {
		return nil, false
	}
	raw = raw[:len(raw)-1]
	neg := raw[0] == '-'
	if neg {
		raw = raw[1:]
	}
	whole, frac, hasFrac := strings.Cut(string(raw), ".")
	if whole == "" || (whole[0] == '0' && len(whole) > 1) || (hasFrac && (frac == "" || len(frac) > 9)) {
		return nil, false
	}
	secs, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || !allDigits(frac) {
		return nil, false
	}
	const maxSeconds = 315576000000 // ±10,000 years, as protojson allows
	if secs > maxSeconds {
		return nil, false
	}
	var nanos int64
	for i := range 9 {
		nanos *= 10
		if i < len(frac) {
			nanos += int64(frac[i] - '0')
		}
	}
	s, n := int64(secs), int32(nanos)
	if neg {
		s, n = -s, -n
	}
	return &durationpb.Duration{Seconds: s, Nanos: n}, true
}

func allDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// base64 reads standard base64 with padding, as the canonical mapping
// writes bytes.
func (d *eventDecoder) base64() ([]byte, bool) {
	raw, ok := d.rawString()
	if !ok || len(raw)%4 != 0 {
		return nil, false
	}
	v, err := base64.StdEncoding.AppendDecode(nil, raw)
	return v, err == nil
}
