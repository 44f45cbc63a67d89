package agent

import (
	"context"
	"encoding/json"
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
// report progress sooner. It is a no-op outside a handler.
func Progress(ctx context.Context) error {
	if j := JobFrom(ctx); j != nil && j.ex != nil {
		return j.ex.progress()
	}
	return nil
}

// Heartbeat is Progress under the name other job systems use.
func Heartbeat(ctx context.Context) error { return Progress(ctx) }
