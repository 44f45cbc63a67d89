package jetfleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Args are a job's arguments: a Go type whose Kind names the job kind it
// is for (the <kind> of jobs.<queue>.<kind>, a stable string). Enqueue
// encodes them as JSON, the job's payload; agent.AddHandler decodes them
// for the handler of that kind.
type Args interface {
	Kind() string
}

// QueueArgs are Args that name their queue; WithQueue still wins.
type QueueArgs interface {
	Args
	Queue() string
}

// DefaultOptionsArgs are Args with default enqueue options (a timeout, max
// attempts…), applied before the options of the call.
type DefaultOptionsArgs interface {
	Args
	EnqueueOptions() []EnqueueOption
}

// DefaultQueue is the queue of jobs whose Args and options name none.
const DefaultQueue = "default"

// EnqueueOption sets one property of an enqueued job.
type EnqueueOption func(*protocol.Job)

// WithQueue puts the job on queue (default DefaultQueue).
func WithQueue(queue string) EnqueueOption { return func(j *protocol.Job) { j.Queue = queue } }

// WithJobID sets the job's id, which is also its idempotency key:
// enqueueing the same id again within the JOBS duplicate window
// (topology.duplicate_window, 10 minutes by default) stores nothing and
// reports Duplicate. Without it the client makes a unique id.
func WithJobID(id string) EnqueueOption { return func(j *protocol.Job) { j.ID = id } }

// WithTimeout bounds one attempt (default: the agent's for the kind).
func WithTimeout(d time.Duration) EnqueueOption { return func(j *protocol.Job) { j.Timeout = d } }

// WithMaxAttempts sets the attempts before the job is dead-lettered.
func WithMaxAttempts(n int) EnqueueOption { return func(j *protocol.Job) { j.MaxAttempts = n } }

// WithBackoff sets the delays before retry 1, 2, …; the last one repeats.
func WithBackoff(delays ...time.Duration) EnqueueOption {
	return func(j *protocol.Job) { j.Backoff = append([]time.Duration(nil), delays...) }
}

// Priorities of a job within its queue (docs/protocol.md §2.3).
const (
	PriorityHigh    = protocol.PriorityHigh
	PriorityDefault = protocol.PriorityDefault
	PriorityLow     = protocol.PriorityLow
)

// WithPriority sets the job's priority within its queue: PriorityHigh,
// PriorityDefault or PriorityLow. An agent with a free slot takes a
// higher-priority job first; a lower one still gets a share of the slots,
// so it never starves. Any other value is refused.
func WithPriority(p string) EnqueueOption { return func(j *protocol.Job) { j.Priority = p } }

// WithProcessAt delays the job until t: it waits in DELAYED, a JetStream
// message schedule, and is enqueued when due (docs/protocol.md §2.2). A
// time that has passed enqueues it now (EnqueueResult.ProcessAtPassed).
func WithProcessAt(t time.Time) EnqueueOption { return func(j *protocol.Job) { j.ProcessAt = t } }

// WithProcessIn delays the job by d from the moment it is enqueued.
func WithProcessIn(d time.Duration) EnqueueOption {
	return func(j *protocol.Job) { j.ProcessAt = time.Now().Add(d) }
}

// WithHeader adds a header to the job's message (for a handler that reads
// job.Headers). Jetfleet-* and Nats-* headers are the options' to set: an
// option's value replaces one given here (the job id is always WithJobID's
// or a new one); another is passed on and read as the protocol says
// (docs/protocol.md §2), and Enqueue refuses a value an agent could not use
// (invalid_argument), as it does an option's.
func WithHeader(key, value string) EnqueueOption {
	return func(j *protocol.Job) {
		if j.Header == nil {
			j.Header = nats.Header{}
		}
		j.Header.Add(key, value)
	}
}

// EnqueueResult is what JetStream answered for one job.
type EnqueueResult struct {
	JobID string `json:"job_id"`
	Queue string `json:"queue"`
	Kind  string `json:"kind"`
	// Sequence is the job message's sequence in JOBS (in DELAYED for a
	// delayed job).
	Sequence uint64 `json:"sequence"`
	// Duplicate is set when a job with the same id was stored within the
	// duplicate window: nothing new was stored, Sequence is the first one's.
	// It is also set when another job holds the job's unique key
	// (WithUnique): nothing was stored, JobID is that job's id and
	// Sequence is zero.
	Duplicate bool `json:"duplicate,omitempty"`
	// ProcessAt is set for a delayed job: it waits in DELAYED (Sequence is
	// its sequence there) until then.
	ProcessAt time.Time `json:"process_at,omitzero"`
	// ProcessAtPassed is set when the job's process_at had passed when it
	// was enqueued: it was enqueued to run now.
	ProcessAtPassed bool `json:"process_at_passed,omitempty"`
	// Err is set by EnqueueMany for a job that was not stored.
	Err error `json:"-"`
}

// Enqueue publishes one job of args' kind, JSON-encoded, and returns once
// JetStream has stored it. The trace context of ctx (and a producer span
// of the client's tracer) travels with the job, so the agent's execution
// span continues the trace.
func (c *Client) Enqueue(ctx context.Context, args Args, opts ...EnqueueOption) (*EnqueueResult, error) {
	msg, job, span, err := c.jobMsg(ctx, args, opts)
	if err != nil {
		return nil, err
	}
	var claim *uniqueClaim
	if job.Unique != nil {
		var holder string
		if claim, holder, err = c.claimUnique(ctx, job); err != nil {
			endSpan(span, nil, err)
			return nil, err
		}
		if holder != "" {
			res := duplicateResult(job, holder, span)
			return &res, nil
		}
	}
	ack, err := c.js.PublishMsg(ctx, msg)
	endSpan(span, ack, err)
	if err != nil {
		claim.releaseAfter(err)
		return nil, enqueueError(job, err)
	}
	res := &EnqueueResult{JobID: job.ID, Queue: job.Queue, Kind: job.Kind, Sequence: ack.Sequence, Duplicate: ack.Duplicate}
	res.setProcessAt(msg, job)
	return res, nil
}

// setProcessAt says whether the job was delayed, or enqueued now although
// it had a process_at.
func (r *EnqueueResult) setProcessAt(msg *nats.Msg, job *protocol.Job) {
	switch {
	case job.ProcessAt.IsZero():
	case msg.Header.Get(protocol.HeaderNatsSchedule) != "":
		r.ProcessAt = job.ProcessAt
	default:
		r.ProcessAtPassed = true
	}
}

// EnqueueParams is one job of EnqueueMany.
type EnqueueParams struct {
	Args    Args
	Options []EnqueueOption
}

// EnqueueMany publishes jobs asynchronously and waits for every answer. It
// returns one result per job, in order; a job that was not stored has Err
// set and the others are stored. The error is for the call as a whole: ctx
// ended before every answer arrived (the results say which were stored).
// Unique keys (WithUnique) are claimed one job after the other, before the
// job is published; a job whose key is held has Duplicate set.
func (c *Client) EnqueueMany(ctx context.Context, params []EnqueueParams) ([]EnqueueResult, error) {
	results := make([]EnqueueResult, len(params))
	futures := make([]jetstream.PubAckFuture, len(params))
	spans := make([]trace.Span, len(params))
	claims := make([]*uniqueClaim, len(params))
	for i, p := range params {
		msg, job, span, err := c.jobMsg(ctx, p.Args, p.Options)
		results[i] = EnqueueResult{JobID: job.ID, Queue: job.Queue, Kind: job.Kind}
		if err != nil {
			results[i].Err = err
			continue
		}
		if job.Unique != nil {
			var holder string
			if claims[i], holder, err = c.claimUnique(ctx, job); err != nil {
				endSpan(span, nil, err)
				results[i].Err = err
				continue
			}
			if holder != "" {
				results[i] = duplicateResult(job, holder, span)
				continue
			}
		}
		results[i].setProcessAt(msg, job)
		spans[i] = span
		if futures[i], err = c.js.PublishMsgAsync(msg); err != nil {
			endSpan(span, nil, err)
			claims[i].releaseAfter(err)
			results[i].Err = enqueueError(job, err)
		}
	}
	var callErr error
	for i, f := range futures {
		if f == nil {
			continue
		}
		var ack *jetstream.PubAck
		var err error
		select {
		case ack = <-f.Ok():
		case err = <-f.Err():
		case <-ctx.Done():
			err, callErr = ctx.Err(), ctx.Err()
		}
		endSpan(spans[i], ack, err)
		if err != nil {
			claims[i].releaseAfter(err)
			results[i].Err = enqueueError(&protocol.Job{ID: results[i].JobID, Queue: results[i].Queue, Kind: results[i].Kind}, err)
			continue
		}
		results[i].Sequence, results[i].Duplicate = ack.Sequence, ack.Duplicate
	}
	return results, callErr
}

// jobMsg builds the message of one job and starts its producer span.
func (c *Client) jobMsg(ctx context.Context, args Args, opts []EnqueueOption) (*nats.Msg, *protocol.Job, trace.Span, error) {
	job := &protocol.Job{Queue: DefaultQueue}
	if args == nil {
		return nil, job, nil, protocol.FieldError("args", "are required")
	}
	job.Kind = args.Kind()
	if qa, ok := args.(QueueArgs); ok && qa.Queue() != "" {
		job.Queue = qa.Queue()
	}
	if da, ok := args.(DefaultOptionsArgs); ok {
		for _, o := range da.EnqueueOptions() {
			o(job)
		}
	}
	for _, o := range opts {
		o(job)
	}
	if job.ID == "" {
		job.ID = nuid.Next()
	}
	payload, err := json.Marshal(args)
	if err != nil {
		return nil, job, nil, protocol.FieldError("args", "cannot be encoded as JSON: %v", err)
	}
	job.Payload = payload
	if job.Header == nil {
		job.Header = nats.Header{}
	}
	ctx, span := c.tracer.Start(ctx, "jetfleet.enqueue "+job.Kind, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String(telemetry.LogJobID, job.ID), attribute.String(telemetry.LogQueue, job.Queue),
			attribute.String(telemetry.LogKind, job.Kind)))
	telemetry.Inject(ctx, job.Header)
	msg, err := job.Msg()
	if err == nil {
		// Headers given through WithHeader are read by the agent as the
		// options' are: one it could not use is refused here, not
		// dead-lettered there.
		_, err = protocol.ParseJob(protocol.JobSubject(job.Queue, job.Kind), msg.Header, nil)
	}
	if err != nil {
		endSpan(span, nil, err)
		return nil, job, nil, protocol.Errorf(protocol.CodeInvalidArgument, "enqueue %s: %v", job.Kind, err)
	}
	return msg, job, span, nil
}

func endSpan(span trace.Span, ack *jetstream.PubAck, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if ack != nil {
		span.SetAttributes(attribute.Int64("stream_sequence", int64(ack.Sequence)), attribute.Bool("duplicate", ack.Duplicate))
	}
	span.End()
}

// enqueueError names the job in err; a stream that is missing or refuses
// the message (too large, full) becomes a *protocol.Error with a code.
func enqueueError(job *protocol.Job, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return protocol.Errorf(protocol.CodeUnavailable, "enqueue %s on queue %s: no stream takes %s: is the fleet's JetStream provisioned?",
			job.Kind, job.Queue, protocol.JobSubject(job.Queue, job.Kind))
	case errors.As(err, &apiErr):
		return protocol.Errorf(protocol.CodeInvalidArgument, "enqueue %s on queue %s: the JOBS stream refused it: %s",
			job.Kind, job.Queue, apiErr.Description)
	}
	return fmt.Errorf("enqueue %s on queue %s: %w", job.Kind, job.Queue, err)
}
