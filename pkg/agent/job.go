package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Job is what a handler gets: the message and what the agent knows about
// this attempt. Handlers must not keep it after they return.
type Job struct {
	ID    string
	Queue string
	Kind  string
	// Payload is the message body.
	Payload []byte
	// Attempt counts attempts, this one included (first is 1).
	Attempt     int
	MaxAttempts int
	// Deadline is when this attempt times out.
	Deadline time.Time
	// ScheduleID and NominalTime are set on jobs fired by the scheduler.
	ScheduleID  string
	NominalTime time.Time
	// ReplayedFrom is set on jobs republished from the dead-letter stream.
	ReplayedFrom string
	// Headers of the message.
	Headers nats.Header
	// StreamSequence of the message in the JOBS stream and how often it was delivered.
	StreamSequence uint64
	Delivered      uint64
	// TraceID of the execution span, once the Tracing middleware started it.
	TraceID string

	ex     *execution // nil outside an agent (a handler called by a test)
	output *OutputTail
	// outcome and errorCode are set once the attempt is settled, for the
	// middleware around the execution.
	outcome   string
	errorCode string
	// registered: the agent runs this kind (metrics label any other kind
	// "_unknown", so strangers cannot grow the label set without bound).
	registered bool
}

// IdempotencyKey identifies this run of the job across all its deliveries
// and attempts (protocol.IdempotencyKey: job id and stream sequence). Key
// side effects by it: delivery is at least once, and a job whose handler
// finished just before its agent died runs again (docs/agent.md).
func (j *Job) IdempotencyKey() string { return protocol.IdempotencyKey(j.ID, j.StreamSequence) }

// AttemptKey identifies this attempt: the IdempotencyKey and the attempt
// number (protocol.AttemptKey).
func (j *Job) AttemptKey() string { return protocol.AttemptKey(j.ID, j.StreamSequence, j.Attempt) }

// Outcome is the event type the attempt ended with (succeeded, retrying,
// snoozed, failed, cancelled, skipped_duplicate), or "" while it runs.
// Middleware around the execution reads it after the next handler returns.
func (j *Job) Outcome() string { return j.outcome }

// Decode unmarshals the JSON payload into v. A payload that does not decode
// is a Malformed error: the job is dead-lettered, never retried.
func (j *Job) Decode(v any) error {
	if err := json.Unmarshal(j.Payload, v); err != nil {
		return Malformed(err)
	}
	return nil
}

// Output returns a sink for the job's output; its tail is kept in the
// job's status record and dead letter.
func (j *Job) Output() *OutputTail { return j.output }

type jobKey struct{}

// WithJob returns ctx carrying job; the agent does this for every handler.
func WithJob(ctx context.Context, job *Job) context.Context {
	return context.WithValue(ctx, jobKey{}, job)
}

// JobFrom returns the job being handled in ctx, or nil.
func JobFrom(ctx context.Context) *Job {
	j, _ := ctx.Value(jobKey{}).(*Job)
	return j
}

// Progress tells JetStream the job in ctx is still being worked on, so it is
// not redelivered. The agent already does this every AckWait/3; call it to
// extend the job's ack deadline sooner. ReportProgress also says how far the
// job got. It is a no-op outside a handler.
func Progress(ctx context.Context) error {
	if j := JobFrom(ctx); j != nil && j.ex != nil {
		return j.ex.progress()
	}
	return nil
}

// Heartbeat is Progress under the name other job systems use.
func Heartbeat(ctx context.Context) error { return Progress(ctx) }

// ErrInvalidProgress is what ReportProgress returns for a fraction that is
// not a number from 0 to 1.
var ErrInvalidProgress = errors.New("agent: invalid progress")

// ReportProgress reports how far the job in ctx got: fraction, from 0 to 1,
// and a short message such as "resizing image 4 of 10". The fleet shows the
// latest report while the job runs (jetfleet.Client.Job, jetfleet jobs get
// and jobs ls), and it extends the job's ack deadline as Progress does.
//
// A fraction that is NaN or outside [0, 1] is refused with
// ErrInvalidProgress, never clamped. The message is cut to
// protocol.MaxProgressMessage (256) bytes of valid UTF-8, control
// characters becoming spaces.
//
// Call it as often as you like: the agent publishes at most one progress
// event per job per protocol.ProgressEventInterval (1s), the latest report
// then, so a handler reporting in a tight loop cannot flood the events
// stream. A report not yet published when the handler returns is dropped:
// the job's outcome follows, and the outcome is its status. It is a no-op
// outside a handler (after validating fraction).
func ReportProgress(ctx context.Context, fraction float64, message string) error {
	if err := protocol.ValidateProgress(fraction); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidProgress, err)
	}
	if j := JobFrom(ctx); j != nil && j.ex != nil {
		return j.ex.reportProgress(fraction, protocol.ProgressMessage(message))
	}
	return nil
}

// ProgressLinePrefix starts a line of an exec handler's output that reports
// progress: "::progress <fraction> <message>", e.g. "::progress 0.4 resizing
// image 4 of 10" (docs/agent.md).
const ProgressLinePrefix = "::progress "

// ParseProgress reads a progress report written as "<fraction> <message>"
// (the message is optional): what follows ProgressLinePrefix in an exec
// handler's output, and the value of an http handler's Jetfleet-Progress
// header. The fraction is a decimal number from 0 to 1, such as 0.4.
func ParseProgress(s string) (fraction float64, message string, err error) {
	s = strings.TrimSpace(s)
	number, message, _ := strings.Cut(s, " ")
	fraction, err = strconv.ParseFloat(number, 64)
	if err != nil {
		return 0, "", fmt.Errorf("%w: %q is not a number from 0 to 1", ErrInvalidProgress, number)
	}
	if err := protocol.ValidateProgress(fraction); err != nil {
		return 0, "", fmt.Errorf("%w: %w", ErrInvalidProgress, err)
	}
	return fraction, strings.TrimSpace(message), nil
}
