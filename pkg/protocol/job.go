package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
)

// MaxJobIDLength bounds a job id.
const MaxJobIDLength = 256

// Job is a job message as a publisher writes it and an agent reads it. The
// body is opaque; every field but Payload travels in a header.
type Job struct {
	// ID is the job's identity (Jetfleet-Job-Id). When set, it is also used
	// as Nats-Msg-Id unless Header sets one, so publishing the same job twice
	// inside the duplicate window yields one message.
	ID string
	// Queue and Kind make the subject: jobs.<queue>.<kind>.
	Queue string
	Kind  string
	// Payload is the message body, usually JSON.
	Payload []byte
	// Timeout bounds one attempt; zero means the agent's default for the kind.
	Timeout time.Duration
	// MaxAttempts before the job is dead-lettered; zero means the agent's default.
	MaxAttempts int
	// Backoff lists the delays before retries; the last one repeats. Empty
	// means the agent's policy for the kind.
	Backoff []time.Duration
	// ScheduleID and NominalTime are set on jobs fired by the scheduler.
	ScheduleID  string
	NominalTime time.Time
	// ProcessAt delays the job until then (Jetfleet-Process-At). Msg stores
	// a job due later in DELAYED; one due now or in the past runs now.
	ProcessAt time.Time
	// Priority is high, default or low (empty: default): the subject's
	// fourth token (docs/protocol.md §2.3).
	Priority string
	// Fired is set on a job a message schedule published (Nats-Scheduler):
	// a delayed job that is due, whatever the agent's clock says.
	Fired bool
	// ReplayedFrom is set on jobs republished from the dead-letter stream.
	ReplayedFrom string
	// Unique is the job's unique key, claimed in bucket unique before the
	// job is published (docs/protocol.md §2.4); Msg only names the claim
	// (Jetfleet-Unique-Key). Nil for none.
	Unique *Unique
	// Header holds every other header of the message, trace context included.
	Header nats.Header
}

// Subject is where the job is published.
func (j Job) Subject() string { return JobSubjectAt(j.Queue, j.Kind, j.Priority) }

// Validate checks what a publisher controls.
func (j Job) Validate() error {
	var errs []error
	if err := ValidateToken("queue", j.Queue); err != nil {
		errs = append(errs, err)
	}
	if err := ValidateToken("kind", j.Kind); err != nil {
		errs = append(errs, err)
	}
	if j.ID != "" {
		if err := ValidateJobID(j.ID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ValidatePriority(j.Priority); err != nil {
		errs = append(errs, err)
	}
	if j.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout %s is negative", j.Timeout))
	}
	if j.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("max attempts %d is negative", j.MaxAttempts))
	}
	for _, d := range j.Backoff {
		if d < 0 {
			errs = append(errs, fmt.Errorf("backoff %s is negative", d))
		}
	}
	if j.Unique != nil {
		if err := j.Unique.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Msg builds the NATS message for the job.
func (j Job) Msg() (*nats.Msg, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	h := nats.Header{}
	for k, v := range j.Header {
		h[k] = append([]string(nil), v...)
	}
	if j.ID != "" {
		h.Set(HeaderJobID, j.ID)
		if h.Get(HeaderMsgID) == "" {
			h.Set(HeaderMsgID, j.ID)
		}
	}
	if j.Timeout > 0 {
		h.Set(HeaderTimeout, j.Timeout.String())
	}
	if j.MaxAttempts > 0 {
		h.Set(HeaderMaxAttempts, strconv.Itoa(j.MaxAttempts))
	}
	if len(j.Backoff) > 0 {
		h.Set(HeaderBackoff, FormatBackoff(j.Backoff))
	}
	if j.ScheduleID != "" {
		h.Set(HeaderScheduleID, j.ScheduleID)
	}
	if !j.NominalTime.IsZero() {
		h.Set(HeaderNominalTime, j.NominalTime.UTC().Format(time.RFC3339Nano))
	}
	if j.ReplayedFrom != "" {
		h.Set(HeaderReplayedFrom, j.ReplayedFrom)
	}
	if j.Unique != nil {
		h.Set(HeaderUniqueKey, UniqueClaimKey(j.Queue, j.Kind, j.Unique.Key))
	}
	if j.ProcessAt.IsZero() {
		return &nats.Msg{Subject: j.Subject(), Header: h, Data: j.Payload}, nil
	}
	h.Set(HeaderProcessAt, j.ProcessAt.UTC().Format(time.RFC3339Nano))
	if !j.Delayed(time.Now()) {
		return &nats.Msg{Subject: j.Subject(), Header: h, Data: j.Payload}, nil // due: it runs now
	}
	if j.ID == "" {
		return nil, errors.New("a delayed job needs an id: its schedule's subject is named after it")
	}
	DelayMsgHeader(h, j.Queue, j.Kind, j.Priority, j.ProcessAt)
	return &nats.Msg{Subject: DelayedSubject(j.Queue, j.Kind, j.ID), Header: h, Data: j.Payload}, nil
}

// Delayed reports whether the job is due after now: Msg stores it in
// DELAYED.
func (j Job) Delayed(now time.Time) bool { return !j.ProcessAt.IsZero() && j.ProcessAt.After(now) }

// DelayMsgHeader adds to h the message schedule that fires a delayed job of
// kind on queue at priority at processAt (docs/protocol.md §2.2): once, on its due
// subject, which JOBS takes it from.
func DelayMsgHeader(h nats.Header, queue, kind, priority string, processAt time.Time) {
	h.Set(HeaderNatsSchedule, "@at "+processAt.UTC().Format(time.RFC3339Nano))
	h.Set(HeaderNatsScheduleTarget, DueSubject(queue, kind, priority))
	h.Set(HeaderNatsScheduleTTL, DelayedDueTTL)
}

// HeaderError reports a job header whose value cannot be used.
type HeaderError struct {
	Header string
	Value  string
	Reason string
}

func (e *HeaderError) Error() string {
	return fmt.Sprintf("header %s: %q %s", e.Header, e.Value, e.Reason)
}

// ParseJob reads a job message. It returns the job and, when some header is
// unusable, an error joining one *HeaderError per bad header; the returned
// job then holds everything that could be read, so the caller can still
// dead-letter it with its identity. Jobs without an id get one from
// FallbackJobID by the caller, who knows the stream sequence.
func ParseJob(subject string, header nats.Header, payload []byte) (Job, error) {
	j := Job{Payload: payload, Header: header}
	var errs []error
	queue, kind, err := ParseJobSubject(subject)
	if err != nil {
		errs = append(errs, err)
	}
	j.Queue, j.Kind, j.Priority = queue, kind, JobPriority(subject)

	bad := func(name, value, reason string) {
		errs = append(errs, &HeaderError{Header: name, Value: value, Reason: reason})
	}
	if v := header.Get(HeaderJobID); v != "" {
		if err := ValidateJobID(v); err != nil {
			bad(HeaderJobID, v, err.Error())
		} else {
			j.ID = v
		}
	} else if v := header.Get(HeaderMsgID); v != "" && ValidateJobID(v) == nil {
		j.ID = v
	}
	if v := header.Get(HeaderTimeout); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			bad(HeaderTimeout, v, "is not a positive duration such as 30s")
		} else {
			j.Timeout = d
		}
	}
	if v := header.Get(HeaderMaxAttempts); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			bad(HeaderMaxAttempts, v, "is not a whole number of at least 1")
		} else {
			j.MaxAttempts = n
		}
	}
	if v := header.Get(HeaderBackoff); v != "" {
		b, err := ParseBackoff(v)
		if err != nil {
			bad(HeaderBackoff, v, err.Error())
		} else {
			j.Backoff = b
		}
	}
	if v := header.Get(HeaderScheduleID); v != "" {
		j.ScheduleID = v
	}
	if v := header.Get(HeaderNominalTime); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			bad(HeaderNominalTime, v, "is not an RFC 3339 time")
		} else {
			j.NominalTime = t
		}
	}
	j.ReplayedFrom = header.Get(HeaderReplayedFrom)
	if v := header.Get(HeaderProcessAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			bad(HeaderProcessAt, v, "is not an RFC 3339 time such as 2026-11-25T18:00:00Z")
		} else {
			j.ProcessAt = t
		}
	}
	j.Fired = header.Get(HeaderNatsScheduler) != ""
	return j, errors.Join(errs...)
}

// IdempotencyKey identifies a job's run across every delivery and attempt
// of its message — <job id>@JOBS:<stream sequence> — for handlers that make
// side effects idempotent: an agent killed after its handler finished but
// before the outcome was stored runs the job again with the same key. A
// job id published again after the duplicate window, or a replayed dead
// letter, is another message and another run, with a key of its own.
func IdempotencyKey(jobID string, streamSequence uint64) string {
	return jobID + "@" + StreamJobs + ":" + strconv.FormatUint(streamSequence, 10)
}

// AttemptKey identifies one attempt of a run: its IdempotencyKey and the
// attempt number, <job id>@JOBS:<stream sequence>#<attempt>.
func AttemptKey(jobID string, streamSequence uint64, attempt int) string {
	return IdempotencyKey(jobID, streamSequence) + "#" + strconv.Itoa(attempt)
}

// FallbackJobID is the id of a job published without Jetfleet-Job-Id and
// Nats-Msg-Id: stable across redeliveries because it is the stream sequence.
func FallbackJobID(streamSequence uint64) string {
	return StreamJobs + "-" + strconv.FormatUint(streamSequence, 10)
}

// ValidateJobID checks that id is usable as a job id: 1 to MaxJobIDLength
// printable characters (Unicode) without spaces.
func ValidateJobID(id string) error {
	if id == "" || utf8.RuneCountInString(id) > MaxJobIDLength || !utf8.ValidString(id) {
		return fmt.Errorf("job id must have 1 to %d characters", MaxJobIDLength)
	}
	for _, r := range id {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("job id %q contains a space or a non-printable character", id)
		}
	}
	return nil
}

// ParseBackoff reads a comma-separated list of non-negative durations.
func ParseBackoff(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d < 0 {
			return nil, fmt.Errorf("is not a comma-separated list of durations such as 1s,10s,1m")
		}
		out = append(out, d)
	}
	return out, nil
}

// FormatBackoff writes delays the way ParseBackoff reads them.
func FormatBackoff(delays []time.Duration) string {
	parts := make([]string, len(delays))
	for i, d := range delays {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

// MaxErrorLength bounds an error message in events and dead letters.
const MaxErrorLength = 4096

// TruncateError keeps at most MaxErrorLength bytes of an error message (valid
// UTF-8, with a note when cut), so a handler that returns a huge error cannot
// make its events or dead letter too large to store.
func TruncateError(s string) string {
	s = ToValidUTF8(s)
	if len(s) <= MaxErrorLength {
		return s
	}
	cut := MaxErrorLength - 32
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(" …[%d bytes cut]", len(s)-cut)
}

// MaxResult bounds a job's result (docs/protocol.md §3.10): the JSON
// document a succeeded event carries, with the output tail, within the
// server's max_payload. An agent's own limit (agent.max_result) may be
// lower; the supervisor fails a workflow step whose result is above this.
const MaxResult = 256 << 10
