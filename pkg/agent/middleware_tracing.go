package agent

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// TracerName is the instrumentation scope of the agent's spans.
const TracerName = "github.com/jetfleet/jetfleet/pkg/agent"

// Tracing runs the job inside a span "agent.execute <kind>" that continues
// the trace of the job message's traceparent header, so the publisher's (or
// the scheduler's) span and the execution are one trace.
func Tracing(tp trace.TracerProvider) Middleware {
	tracer := tp.Tracer(TracerName)
	startOptions := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	var names spanNameCache
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			ctx = telemetry.Extract(ctx, job.Headers)
			n := names.get(job)
			ctx, span := tracer.Start(ctx, n.span, startOptions...)
			defer span.End()
			job.TraceID = span.SpanContext().TraceID().String()
			err := next(ctx, job)
			// Set once, at the end, when outcome and attempt are known: the
			// SDK sizes the attribute slice for the first set and copies it
			// for every later one, and exporters read attributes at End.
			// The SDK copies what it is given, so the list is reused.
			attrs := spanAttrPool.Get().(*spanAttrs)
			*attrs = spanAttrs{
				messagingSystem,
				attribute.String("messaging.destination.name", n.destination),
				attribute.String("jetfleet.job_id", job.ID),
				attribute.String("jetfleet.queue", job.Queue),
				attribute.String("jetfleet.kind", job.Kind),
				attribute.Int64("jetfleet.stream_sequence", int64(job.StreamSequence)),
				attribute.Int64("jetfleet.delivered", int64(job.Delivered)),
				attribute.String("jetfleet.outcome", job.Outcome()),
				attribute.Int("jetfleet.attempt", job.Attempt),
			}
			span.SetAttributes(attrs[:]...)
			spanAttrPool.Put(attrs)
			if err != nil && !isType[*SnoozeError](err) {
				span.RecordError(err)
				span.SetStatus(codes.Error, job.Outcome())
			}
			return err
		}
	}
}

var messagingSystem = attribute.String("messaging.system", "nats")

// spanAttrs are the attributes of a job's span.
type spanAttrs [9]attribute.KeyValue

var spanAttrPool = sync.Pool{New: func() any { return new(spanAttrs) }}

// spanNames are the names a job's span carries that depend on its queue
// and kind alone.
type spanNames struct {
	span        string // "agent.execute <kind>"
	destination string // the job's subject without its id: "jobs.<queue>.<kind>"
}

// spanNameCache keeps the spanNames of the kinds the agent runs, so a job
// costs no string building for them. Other kinds (made up by a message)
// are not kept: they could grow the cache without bound.
type spanNameCache struct{ m sync.Map }

type queueKind struct{ queue, kind string }

func (c *spanNameCache) get(job *Job) *spanNames {
	key := queueKind{job.Queue, job.Kind}
	if n, ok := c.m.Load(key); ok {
		return n.(*spanNames)
	}
	n := &spanNames{span: "agent.execute " + job.Kind, destination: "jobs." + job.Queue + "." + job.Kind}
	if job.registered {
		c.m.Store(key, n)
	}
	return n
}
